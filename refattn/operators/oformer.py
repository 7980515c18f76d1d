r"""OFormer linear attention: Galerkin/Fourier-type attention with quadrature weights, masks and RoPE.

Paper: Li, Meidani, Barati Farimani, "Transformer for Partial Differential Equations' Operator
Learning", TMLR 2023, arXiv 2205.13671. Upstream: BaratiLab/OFormer
``airfoil/nn_module/attention_module.py`` @ f1111b3c634893329e14e47e8903e421dd726a0c
(``LinearAttention`` — encoder self-attention, ``CrossLinearAttention`` — decoder
cross-attention); maintained variant neuraloperator ``neuralop/layers/attention_kernel_integral.py``
@ 93d3f0633e048c915004cd782cb339acf06e1157 (``AttentionKernelIntegral``).

Forward
-------
``to_qkv`` (self) or ``to_q`` + ``to_kv`` (cross: keys and values from the input function ``z``),
no biases, split into heads of width $d$; Galerkin type normalises $K, V$, Fourier type $Q, K$
(instance norm over the points by default, or a LayerNorm shared by the heads); optional rotary
embedding of $q, k$ (``pos_mode="rope"``) or coordinate concatenation (``"cat"``); then, with
quadrature weights $w$ (default $w_j = 1/M$, $M$ = number of key points or of real points under
a padding mask; no $1/\sqrt d$):

$$\text{Galerkin: } Z_h = \hat Q\big(\hat K^\top\,\mathrm{diag}(w)\,\hat V\big),\qquad
\text{Fourier: } Z_h = \big(\hat Q\hat K^\top\big)\mathrm{diag}(w)\,\hat V,$$

heads merged and ``to_out.0`` (absent when ``n_head == 1``, ``dim_head == C`` and
``pos_mode != "cat"``, as upstream's ``project_out``). The un-weighted form is the Galerkin /
Fourier attention of ``refattn.operators.galerkin`` with $1/n$ folded into $w$.

Backward
--------
As Galerkin/Fourier with the source weights inside: Galerkin with
$M = \hat K^\top\mathrm{diag}(w)\hat V$: $d\hat Q = G_q M^\top$, $dM = \hat Q^\top G_q$,
$d\hat K = \mathrm{diag}(w)\hat V\,dM^\top$, $d\hat V = \mathrm{diag}(w)\hat K\,dM$ ($G_q$ = the
output-weighted $G$); Fourier with $A = \hat Q\hat K^\top$: $d\hat V = \mathrm{diag}(w)A^\top G_q$,
$dA = G_q(\mathrm{diag}(w)\hat V)^\top$, $d\hat Q = dA\hat K$, $d\hat K = dA^\top\hat Q$; then the
padding masks, the inverse rotation for RoPE ($R(\phi)^\top = R(-\phi)$), the norm VJPs (masked
instance norm: statistics over the real points only) and the projections.

Upstream conventions made explicit here (keywords of ``oformer_attention_forward``)
-----------------------------------------------------------------------------------
* ``norm_axis``: BaratiLab's ``norm_wrt_domain`` applies ``InstanceNorm1d(dim_head)`` to a
  ``(b h) n d`` tensor, which normalises each *point* over its channels (OFormer#3, confirmed by
  the author; ``"channels"``). neuraloperator's ``AttentionKernelIntegral`` does the same: its
  ``normalize_wrt_domain`` views $k, v$ as ``(b h, N, d)`` before ``nn.InstanceNorm1d(d)``, so
  it too normalises each point over its channels in every version of the file (its comment
  says "instance norm with spatial dimension"). The per-channel norm over the points that both
  intend is ``"points"`` (default).
* Parameter layouts (read from the keys): OFormer's fused ``to_qkv`` (self) / ``to_q`` +
  ``to_kv`` (cross) with ``to_out.0``; or neuraloperator's ``AttentionKernelIntegral`` with
  separate ``to_q`` (optional: ``project_query=False`` uses the query features as they are),
  ``to_k``, ``to_v`` and ``to_out`` — ``nn.Identity`` exactly when ``heads * d ==
  out_channels`` (keyword ``out_channels``, else inferred from ``to_out.weight``). The output
  width may differ from the input width in both layouts.
* ``padding_mask``: BaratiLab's two branches normalise along different axes. Without padding,
  ``norm_wrt_domain`` normalises each point over its channels (``norm_axis="channels"``, above);
  with a padding mask, ``masked_instance_norm(x, mask)`` on the ``(b h) n d`` tensor normalises
  each channel over the real points (``norm_axis="points"``, eps 1e-5). That function also
  **detaches** the masked mean and variance (``mean.detach()``, ``var.detach()``), so upstream's
  gradient is $dx = r\,(m\odot dy)$ only: ``masked_norm_grad="detached"`` reproduces it;
  ``"exact"`` (default) is the true derivative of the same forward (the statistics depend on
  $x$). The forward is identical either way. Upstream's ``CrossLinearAttention`` also masks the
  queries with the key mask; refattn masks only keys/values in cross-attention.
* ``weights_placement``: neuraloperator multiplies the **output rows** by the weights
  (``"output"``); the quadrature $\sum_j k(x_i,y_j)f(y_j)w_j$ needs $K^\top\mathrm{diag}(w)V$
  (``"source"``, default); they agree only for uniform weights and $N = M$.
* ``pos_mode="rope"`` is upstream ``relative_emb`` (rotate-half layout, angles scaled by
  ``rope_scale / min_freq``); ``"cat"`` is ``cat_pos``.
* ``oformer_init_params`` follows upstream ``_init_params`` with ``init_method='xavier'``
  (upstream's default is ``orthogonal_`` on the same blocks).
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.rope import apply_rope, rope_frequencies
from ..registry import Mechanism, Sample, register
from .common import swap_last, xavier_uniform

__all__ = [
    "oformer_attention_forward",
    "oformer_attention_backward",
    "oformer_attention",
    "oformer_init_params",
]

_OF_NORMED = {"galerkin": ("k", "v"), "fourier": ("q", "k")}


def _bool_mask(mask, name, shape):
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"{name} must be a boolean array (True = real point); got dtype {m.dtype}")
    if m.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {m.shape}")
    if not m.any(axis=-1).all():
        raise ValueError(f"{name} must keep at least one point per batch element")
    return m


def _oformer_rope_tables(pos, d, rope_dim, min_freq, scale):
    """cos/sin tables (B, 1, N, d/(2 rope_dim)) per coordinate, OFormer's ``RotaryEmbedding``."""
    sub = d // rope_dim
    freqs = rope_frequencies(sub)                               # 1 / 10000^(2m/sub)
    out = []
    for a in range(rope_dim):
        ang = (pos[..., a] * (scale / min_freq))[..., None] * freqs
        out.append((np.cos(ang)[:, None], np.sin(ang)[:, None]))
    return out


def _oformer_rope(t, tables, inverse=False):
    sub = t.shape[-1] // len(tables)
    parts = [apply_rope(t[..., a * sub:(a + 1) * sub], c, -s if inverse else s)
             for a, (c, s) in enumerate(tables)]
    return np.concatenate(parts, axis=-1)


def _mask_rows(ops, mq, mk):
    """Zero padded rows: keys/values with ``mk``, queries with ``mq`` (self-attention only)."""
    out = dict(ops)
    for t, m in (("q", mq), ("k", mk), ("v", mk)):
        if m is not None:
            out[t] = ops[t] * m
    return out


def oformer_attention_forward(x, params, z=None, *, n_head: int, attn_type="galerkin",
                              norm_type="instance", norm_axis="points", pos_mode=None,
                              x_pos=None, z_pos=None, rope_dim: int = 2, min_freq: float = 1 / 64,
                              rope_scale: float = 1.0, padding_mask=None, weights=None,
                              weights_placement="source", eps: float = 1e-5,
                              masked_norm_grad="exact", out_channels=None):
    r"""OFormer linear attention: encoder self-attention (``z=None``) or decoder cross-attention.

    $$\text{Galerkin: } Z_h = \hat Q\big(\hat K^\top\,\mathrm{diag}(w)\,\hat V\big),\qquad
    \text{Fourier: } Z_h = \big(\hat Q\hat K^\top\big)\mathrm{diag}(w)\,\hat V,$$

    $w_j = 1/M$ by default (no $1/\sqrt d$; $M$ = number of key points, or of real points under
    ``padding_mask``). Galerkin normalises $K, V$, Fourier $Q, K$. Heads merged, then
    ``to_out.0`` (absent when ``n_head == 1``, ``dim_head == C`` and ``pos_mode != "cat"``, as
    upstream's ``project_out``).

    Parameters
    ----------
    x : array (B, N, C)
        Query points (encoder: all points; decoder: output points' features).
    params : dict
        Self: ``to_qkv.weight`` (C, 3 H d) (no bias; columns q | k | v, head-major). Cross:
        ``to_q.weight`` (C, H d) and ``to_kv.weight`` (C, 2 H d). ``norm_type="layer"`` adds
        ``{q,k,v}_norm.weight`` / ``.bias`` (d,) (one LayerNorm shared by the heads, upstream
        ``use_ln=True``). ``to_out.0.weight`` (H d [+ H P], C_out), ``to_out.0.bias`` (C_out,).
        neuraloperator ``AttentionKernelIntegral`` layout (recognised by ``to_k.weight``):
        ``to_q.weight`` (C, H d) (absent: ``project_query=False``, needs C = H d),
        ``to_k.weight``, ``to_v.weight`` (C, H d), ``to_out.weight`` (H d, C_out) and
        ``to_out.bias`` (C_out,), absent when ``H d == out_channels`` (upstream ``nn.Identity``).
    z : array (B, M, C), optional
        Input function for cross-attention (``CrossLinearAttention``); keys/values from ``z``.
    attn_type : {"galerkin", "fourier"}
    norm_type : {"instance", "layer"}
        ``nn.InstanceNorm1d`` (upstream default, no affine) or ``nn.LayerNorm(d)``.
    norm_axis : {"points", "channels"}
        Axis of the instance norm. ``"points"``: each channel over the points (the intended
        operator; what BaratiLab's padded branch computes). ``"channels"``: what BaratiLab's
        unpadded ``norm_wrt_domain`` and neuraloperator's ``AttentionKernelIntegral`` actually
        compute — ``InstanceNorm1d(d)`` on a ``(b h) n d`` tensor normalises each point over its
        channels (OFormer#3, confirmed by the author); use it to reproduce either upstream.
    pos_mode : {None, "rope", "cat"}
        ``"rope"``: upstream ``relative_emb`` — rotary embedding of q (``x_pos``) and k
        (``z_pos``) per coordinate on consecutive channel blocks of width ``d / rope_dim``,
        rotate-half layout, angles ``pos * rope_scale / min_freq * 10000^(-2m/(d/rope_dim))``.
        ``"cat"``: upstream ``cat_pos`` — coordinates concatenated in front of q, k, v.
    x_pos, z_pos : arrays (B, N, P), (B, M, P)
        Coordinates (not differentiated). Self-attention uses ``x_pos`` for both.
    padding_mask : bool array (B, M), optional
        True = real point. Statistics of the instance norm run over real points, padded rows of
        $\hat K,\hat V$ (and of $\hat Q$ in self-attention) are zeroed, $w_j = 1/\#\text{real}$.
        Upstream (``masked_instance_norm``) normalises over the real points in this branch,
        whatever ``norm_axis`` would say for the unpadded branch: pass ``norm_axis="points"``.
    masked_norm_grad : {"exact", "detached"}
        Gradient of the masked instance norm (``padding_mask`` with ``norm_type="instance"``,
        ``norm_axis="points"``). ``"exact"`` (default): the true derivative, mean and variance
        depend on the input. ``"detached"``: upstream's ``masked_instance_norm`` detaches both
        (``mean.detach()``, ``var.detach()``), so its gradient is $dx = r\,(m\odot dy)$ with
        $r = (\sigma^2+\epsilon)^{-1/2}$; use it to reproduce upstream's gradients. The forward
        is the same.
    weights : array (B, M), optional
        Quadrature weights replacing $1/M$ (neuraloperator ``AttentionKernelIntegral``).
    weights_placement : {"source", "output"}
        ``"source"``: $K^\top\mathrm{diag}(w)V$ (the integral $\sum_j k(x_i,y_j)f(y_j)w_j$).
        ``"output"``: neuraloperator multiplies the **output rows** by the weights
        (``weights.view(b, 1, n, 1)``), equal to ``"source"`` only for uniform weights and only
        when N = M.
    eps : float
        Norm epsilon (1e-5).
    out_channels : int, optional
        Output width (neuraloperator ``out_channels``). With the neuraloperator layout it decides
        whether ``to_out`` exists (``nn.Identity`` when ``H d == out_channels``); by default the
        width is read from the output projection's weight (or is ``H d`` without one).

    Returns
    -------
    out (B, N, C_out), cache
    """
    check_choice(attn_type, "attn_type", ("galerkin", "fourier"))
    check_choice(norm_type, "norm_type", ("instance", "layer"))
    check_choice(norm_axis, "norm_axis", ("points", "channels"))
    check_choice(pos_mode, "pos_mode", (None, "rope", "cat"))
    check_choice(weights_placement, "weights_placement", ("source", "output"))
    check_choice(masked_norm_grad, "masked_norm_grad", ("exact", "detached"))
    eps = check_positive(eps, "eps")
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    cross = z is not None
    if cross:
        z = as_float(z, "z", ndim=3)
        if z.shape[0] != b or z.shape[2] != c:
            raise ValueError(f"z must have shape (B={b}, M, C={c}); got {z.shape}")
    src = z if cross else x
    m = src.shape[1]
    n_head = check_int(n_head, "n_head", minimum=1)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    layout = "neuralop" if "to_k.weight" in params else "oformer"
    if layout == "neuralop":
        wkey, mult = "to_k.weight", 1
    else:
        wkey, mult = ("to_q.weight", 1) if cross else ("to_qkv.weight", 3)
    if np.ndim(params.get(wkey)) == 2:  # dim_head is read off its output axis: check its input axis first
        check_weight_in(params, wkey, c, input_name="z" if cross and wkey == "to_k.weight" else "x")
    w0 = params.get(wkey)
    if w0 is None or np.ndim(w0) != 2 or np.shape(w0)[1] % (mult * n_head):
        raise ValueError(f"params must contain {wkey!r} of shape (C, {mult} * n_head * dim_head); "
                         f"got {None if w0 is None else np.shape(w0)}")
    d = np.shape(w0)[1] // (mult * n_head)
    npos = 0
    tables_q = tables_k = None
    if pos_mode is not None:
        x_pos = as_float(x_pos, "x_pos", ndim=3)
        if x_pos.shape[:2] != (b, n):
            raise ValueError(f"x_pos must have shape (B={b}, N={n}, P); got {x_pos.shape}")
        if cross:
            z_pos = as_float(z_pos, "z_pos", ndim=3)
            if z_pos.shape[:2] != (b, m) or z_pos.shape[2] != x_pos.shape[2]:
                raise ValueError(f"z_pos must have shape (B={b}, M={m}, P={x_pos.shape[2]}); got {z_pos.shape}")
        else:
            z_pos = x_pos
        if pos_mode == "rope":
            rope_dim = check_int(rope_dim, "rope_dim", minimum=1)
            if x_pos.shape[2] != rope_dim:
                raise ValueError(f"x_pos must have rope_dim={rope_dim} coordinates; got {x_pos.shape[2]}")
            if d % (2 * rope_dim):
                raise ValueError(f"dim_head ({d}) must be divisible by 2 * rope_dim ({2 * rope_dim}) for RoPE")
            min_freq = check_positive(min_freq, "min_freq")
            rope_scale = check_positive(rope_scale, "rope_scale")
            tables_q = _oformer_rope_tables(x_pos, d, rope_dim, min_freq, rope_scale)
            tables_k = _oformer_rope_tables(z_pos, d, rope_dim, min_freq, rope_scale)
        else:
            npos = x_pos.shape[2]
    padding_mask = _bool_mask(padding_mask, "padding_mask", (b, m))
    if weights is not None:
        weights = as_float(weights, "weights", ndim=2)
        if weights.shape != (b, m):
            raise ValueError(f"weights must have shape (B={b}, M={m}); got {weights.shape}")
        if weights_placement == "output" and m != n:
            raise ValueError(f"weights_placement='output' multiplies output rows: it needs N == M; got N={n}, M={m}")
    hd = n_head * d
    optional = ()
    if layout == "neuralop":
        spec = {"to_q.weight": (c, hd), "to_k.weight": (c, hd), "to_v.weight": (c, hd)}
        optional = ("to_q.weight",)
        if params.get("to_q.weight") is None and c != hd:
            raise ValueError(f"without 'to_q.weight' (project_query=False) the query features are used as "
                             f"they are: C={c} must equal n_head * dim_head = {hd}")
    elif cross:
        spec = {"to_q.weight": (c, hd), "to_kv.weight": (c, 2 * hd)}
    else:
        spec = {"to_qkv.weight": (c, 3 * hd)}
    if norm_type == "layer":
        for t in _OF_NORMED[attn_type]:
            spec[f"{t}_norm.weight"] = (d,)
            spec[f"{t}_norm.bias"] = (d,)
    out_key = "to_out" if layout == "neuralop" else "to_out.0"
    w_out = params.get(f"{out_key}.weight")
    if out_channels is not None:
        out_channels = check_int(out_channels, "out_channels", minimum=1)
    elif w_out is not None and np.ndim(w_out) == 2:
        out_channels = np.shape(w_out)[1]
    if layout == "neuralop":
        # AttentionKernelIntegral: to_out is nn.Identity exactly when heads * d == out_channels
        project_out = w_out is not None if out_channels is None else hd != out_channels
    else:
        project_out = not (n_head == 1 and d == c) or pos_mode == "cat"
    if project_out:
        c_out = c if out_channels is None else out_channels
        spec[f"{out_key}.weight"] = (n_head * (d + npos), c_out)
        spec[f"{out_key}.bias"] = (c_out,)
    elif out_channels is not None and out_channels != n_head * (d + npos):
        raise ValueError(f"out_channels={out_channels} needs an output projection: without one the output has "
                         f"n_head * dim_head = {n_head * (d + npos)} channels")
    p = check_params(params, spec, optional=optional)
    dt = compute_dtype(x, z, weights, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    src = src.astype(dt, copy=False)

    if layout == "neuralop":
        ops = {"q": split_heads(x @ p["to_q.weight"] if "to_q.weight" in p else x, n_head),
               "k": split_heads(src @ p["to_k.weight"], n_head), "v": split_heads(src @ p["to_v.weight"], n_head)}
    elif cross:
        ops = {"q": split_heads(x @ p["to_q.weight"], n_head)}
        kv = src @ p["to_kv.weight"]
        ops["k"] = split_heads(kv[..., :n_head * d], n_head)
        ops["v"] = split_heads(kv[..., n_head * d:], n_head)
    else:
        qkv = x @ p["to_qkv.weight"]
        ops = {t: split_heads(qkv[..., i * n_head * d:(i + 1) * n_head * d], n_head)
               for i, t in enumerate("qkv")}
    # point masks (B, 1, len, 1): keys/values always; queries only in self-attention
    mk = None if padding_mask is None else padding_mask[:, None, :, None].astype(dt)
    mq = mk if not cross else None
    norm_cache = {}
    for t in _OF_NORMED[attn_type]:
        mt = mq if t == "q" else mk
        if norm_type == "layer":
            xhat, stats = normalize_forward(ops[t], (3,), eps)
            ops[t] = xhat * p[f"{t}_norm.weight"] + p[f"{t}_norm.bias"]
        elif norm_axis == "points":
            xhat, stats = normalize_forward(ops[t], (2,), eps, mask=mt)
            stats = dict(stats, detached=mt is not None and masked_norm_grad == "detached")
            ops[t] = xhat
        else:
            xhat, stats = normalize_forward(ops[t], (3,), eps)
            ops[t] = xhat
        norm_cache[t] = (xhat, stats)
    if tables_q is not None:
        ops["q"] = _oformer_rope(ops["q"], tables_q)
        ops["k"] = _oformer_rope(ops["k"], tables_k)
    if pos_mode == "cat":
        pq = np.broadcast_to(x_pos.astype(dt)[:, None], (b, n_head, n, npos))
        pk = np.broadcast_to(z_pos.astype(dt)[:, None], (b, n_head, m, npos))
        hat = {"q": np.concatenate([pq, ops["q"]], -1), "k": np.concatenate([pk, ops["k"]], -1),
               "v": np.concatenate([pk, ops["v"]], -1)}
    else:
        hat = dict(ops)
    hat = _mask_rows(hat, mq, mk)
    # quadrature: sv (source weights, B,1,M,1), so (output weights, B,1,N,1)
    if weights is None:
        cnt = np.full(b, float(m)) if padding_mask is None else padding_mask.sum(-1).astype(float)
        wq = np.broadcast_to((1.0 / cnt)[:, None], (b, m)).astype(dt)
    else:
        wq = weights.astype(dt, copy=False)
    if weights_placement == "source":
        sv, so = wq[:, None, :, None], np.ones((1, 1, 1, 1), dt)
    else:
        sv, so = np.ones((1, 1, 1, 1), dt), wq[:, None, :, None]
    wv = sv * hat["v"]
    if attn_type == "galerkin":
        mm = swap_last(hat["k"]) @ wv
        zq = hat["q"] @ mm
        core = {"mm": mm}
    else:
        a = hat["q"] @ swap_last(hat["k"])
        zq = a @ wv
        core = {"a": a}
    zz = so * zq
    zm = merge_heads(zz)
    out = linear_prefixed(p, out_key, zm) if project_out else zm
    cache = dict(x=x, src=src, p=p, cross=cross, n_head=n_head, d=d, type=attn_type,
                 norm_type=norm_type, norm=norm_cache, tq=tables_q, tk=tables_k, npos=npos,
                 mq=mq, mk=mk, hat=hat, wv=wv, sv=sv, so=so, zq=zq, zm=zm,
                 project_out=project_out, out_key=out_key, layout=layout, out_shape=out.shape, **core)
    return out, cache


def oformer_attention_backward(dout, cache):
    """Gradients of :func:`oformer_attention_forward`: ``x``, ``z`` (cross) and every params key.

    Galerkin with $M = \\hat K^\\top\\mathrm{diag}(w)\\hat V$: $d\\hat Q = G_q M^\\top$,
    $dM = \\hat Q^\\top G_q$, $d\\hat K = \\mathrm{diag}(w)\\hat V\\,dM^\\top$,
    $d\\hat V = \\mathrm{diag}(w)\\hat K\\,dM$ ($G_q$ = output-weighted $G$); Fourier with
    $A = \\hat Q\\hat K^\\top$: $d\\hat V = \\mathrm{diag}(w)A^\\top G_q$, $dA = G_q(\\mathrm{diag}(w)\\hat V)^\\top$,
    $d\\hat Q = dA\\hat K$, $d\\hat K = dA^\\top\\hat Q$; then the padding masks, the RoPE inverse
    rotation, the norm VJPs and the projections.
    """
    x, src, p, n_head = cache["x"], cache["src"], cache["p"], cache["n_head"]
    hat, sv, so, npos = cache["hat"], cache["sv"], cache["so"], cache["npos"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dzm = linear_prefixed_vjp(grads, p, cache["out_key"], dout, cache["zm"]) if cache["project_out"] else dout
    gq = so * split_heads(dzm, n_head)
    if cache["type"] == "galerkin":
        mm = cache["mm"]
        dh = {"q": gq @ swap_last(mm)}
        dm = swap_last(hat["q"]) @ gq
        dh["k"] = cache["wv"] @ swap_last(dm)
        dh["v"] = sv * (hat["k"] @ dm)
    else:
        a = cache["a"]
        dh = {"v": sv * (swap_last(a) @ gq)}
        da = gq @ swap_last(cache["wv"])
        dh["q"] = da @ hat["k"]
        dh["k"] = swap_last(da) @ hat["q"]
    dh = _mask_rows(dh, cache["mq"], cache["mk"])
    if npos:
        dh = {t: dh[t][..., npos:] for t in dh}
    if cache["tq"] is not None:
        dh["q"] = _oformer_rope(dh["q"], cache["tq"], inverse=True)
        dh["k"] = _oformer_rope(dh["k"], cache["tk"], inverse=True)
    for t, (xhat, stats) in cache["norm"].items():
        if cache["norm_type"] == "layer":
            grads[f"{t}_norm.weight"] = np.sum(dh[t] * xhat, axis=(0, 1, 2))
            grads[f"{t}_norm.bias"] = np.sum(dh[t], axis=(0, 1, 2))
            dh[t] = normalize_backward(dh[t] * p[f"{t}_norm.weight"], xhat, stats)
        elif stats.get("detached"):
            dh[t] = stats["rstd"] * (dh[t] * stats["mask"])   # upstream: mean/var detached
        else:
            dh[t] = normalize_backward(dh[t], xhat, stats)
    dq, dk, dv = (merge_heads(dh[t]) for t in "qkv")
    if cache["layout"] == "neuralop":
        if "to_q.weight" in p:
            grads["to_q.weight"] = np.einsum("bni,bno->io", x, dq)
            dq = dq @ p["to_q.weight"].T
        dsrc = 0.0
        for t, g in (("k", dk), ("v", dv)):
            grads[f"to_{t}.weight"] = np.einsum("bni,bno->io", src, g)
            dsrc = dsrc + g @ p[f"to_{t}.weight"].T
        if cache["cross"]:
            grads["x"], grads["z"] = dq, dsrc
        else:
            grads["x"] = dq + dsrc
    elif cache["cross"]:
        grads["to_q.weight"] = np.einsum("bni,bno->io", x, dq)
        dkv = np.concatenate([dk, dv], -1)
        grads["to_kv.weight"] = np.einsum("bni,bno->io", src, dkv)
        grads["x"] = dq @ p["to_q.weight"].T
        grads["z"] = dkv @ p["to_kv.weight"].T
    else:
        dqkv = np.concatenate([dq, dk, dv], -1)
        grads["to_qkv.weight"] = np.einsum("bni,bno->io", x, dqkv)
        grads["x"] = dqkv @ p["to_qkv.weight"].T
    return grads


def oformer_attention(x, params, z=None, **config):
    """Convenience wrapper: the output of :func:`oformer_attention_forward`."""
    return oformer_attention_forward(x, params, z, **config)[0]


def oformer_init_params(rng, dim: int, n_head: int = 8, dim_head: int = 64, *, cross: bool = False,
                        attn_type="galerkin", norm_type="instance", pos_dim: int = 0,
                        init_gain=None, dtype=np.float64) -> dict:
    """OFormer initialisation: per-head blocks of the projections (q for Galerkin self-attention,
    v for Fourier self-attention, q, k, v for cross-attention) ``xavier_uniform_(gain)`` plus
    ``gain * I`` (gain default ``1/dim_head``, upstream ``init_method='xavier'``; upstream's default
    is ``orthogonal_`` on the same blocks); the other blocks PyTorch's default init; LayerNorm 1/0;
    ``to_out`` PyTorch default. ``pos_dim > 0`` sizes ``to_out`` for ``pos_mode="cat"``."""
    gain = 1.0 / dim_head if init_gain is None else init_gain
    hd = n_head * dim_head

    def block(n_in):
        bound = 1.0 / np.sqrt(n_in)
        return rng.uniform(-bound, bound, (n_in, hd))

    def special():
        w = block(dim)
        for h in range(n_head):
            blk = xavier_uniform(rng, dim, dim_head, gain)
            blk[np.arange(min(dim, dim_head)), np.arange(min(dim, dim_head))] += gain
            w[:, h * dim_head:(h + 1) * dim_head] = blk
        return w

    p = {}
    if cross:
        p["to_q.weight"] = special()
        p["to_kv.weight"] = np.concatenate([special(), special()], -1)
    else:
        parts = [block(dim), block(dim), block(dim)]
        parts[0 if attn_type == "galerkin" else 2] = special()
        p["to_qkv.weight"] = np.concatenate(parts, -1)
    if norm_type == "layer":
        for t in _OF_NORMED[attn_type]:
            p[f"{t}_norm.weight"] = np.ones(dim_head)
            p[f"{t}_norm.bias"] = np.zeros(dim_head)
    if not (n_head == 1 and dim_head == dim) or pos_dim > 0:
        p.update(init_linear_prefixed(rng, n_head * (dim_head + pos_dim), dim, "to_out.0"))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_oformer(cross=False, attn_type="galerkin", norm_type="instance", pos_mode=None,
                    padding=False, weights=False, placement="source", norm_axis="points",
                    masked_norm_grad="exact"):
    def sample(rng, size):
        n = int(rng.integers(3, 5)) if size == "tiny" else int(rng.integers(7, 11))
        c, h, d = (4, 2, 2) if size == "tiny" else (6, 2, 4)
        if pos_mode == "rope":
            c, h, d = (4, 1, 4) if size == "tiny" else (8, 2, 4)
        npos = 2 if pos_mode else 0
        params = oformer_init_params(rng, c, h, d, cross=cross, attn_type=attn_type,
                                     norm_type=norm_type, pos_dim=npos if pos_mode == "cat" else 0,
                                     init_gain=0.7)
        for k in params:
            if "norm" in k or k.endswith("bias"):
                params[k] = params[k] + 0.3 * rng.standard_normal(params[k].shape)
        m = n + 1 if cross else n
        inputs = {"x": rng.standard_normal((2, n, c))}
        if cross:
            inputs["z"] = rng.standard_normal((2, m, c))
        config = {"n_head": h, "attn_type": attn_type, "norm_type": norm_type,
                  "norm_axis": norm_axis, "weights_placement": placement,
                  "masked_norm_grad": masked_norm_grad}
        if pos_mode:
            config.update(pos_mode=pos_mode, x_pos=rng.uniform(0, 1, (2, n, npos)))
            if cross:
                config["z_pos"] = rng.uniform(0, 1, (2, m, npos))
            if pos_mode == "rope":
                config.update(min_freq=1.0, rope_scale=3.0)
        if padding:
            pm = np.ones((2, m), bool)
            pm[0, -1] = False
            pm[1, -2:] = False
            config["padding_mask"] = pm
        if weights:
            config["weights"] = rng.uniform(0.05, 0.4, (2, m))
        return Sample(inputs=inputs, params=params, config=config)
    return sample


def _oformer_reference(x, params, z=None, **config):
    # Explicit O(N M) kernel form: Galerkin (Q K^T) diag(w) V, Fourier Q (K^T diag(w) V).
    _, c = oformer_attention_forward(x, params, z, **config)
    h = c["hat"]
    zq = (h["q"] @ swap_last(h["k"])) @ c["wv"] if c["type"] == "galerkin" else h["q"] @ (swap_last(h["k"]) @ c["wv"])
    zm = merge_heads(c["so"] * zq)
    return linear_prefixed(c["p"], c["out_key"], zm) if c["project_out"] else zm


def _check_oformer_variants_fd(rng):
    from ..testing.gradcheck import gradcheck
    errs = []
    for kw in (dict(cross=True, pos_mode="rope"), dict(attn_type="fourier", norm_type="layer", pos_mode="cat"),
               dict(cross=True, attn_type="fourier", padding=True), dict(padding=True, pos_mode="rope"),
               dict(weights=True, placement="output"), dict(cross=True, weights=True),
               dict(norm_axis="channels", attn_type="fourier")):
        s = _sample_oformer(**kw)(rng, "tiny")
        errs.append(gradcheck(oformer_attention_forward, oformer_attention_backward, s).max_rel)
    return max(errs)


def _check_oformer_neuralop_layout(rng):
    # neuraloperator AttentionKernelIntegral layout: separate to_q/to_k/to_v, to_out with C_out != C
    # or nn.Identity (heads*d == out_channels), project_query=False; FD gradchecks.
    from ..testing.gradcheck import gradcheck
    errs = []
    for c, h, d, c_out, with_q in ((3, 2, 2, 5, True), (4, 2, 2, 4, False), (4, 2, 2, 3, False)):
        p = {f"to_{t}.weight": 0.6 * rng.standard_normal((c, h * d)) for t in ("qkv" if with_q else "kv")}
        cfg = {"n_head": h, "norm_axis": "channels", "weights_placement": "output", "out_channels": c_out}
        if h * d != c_out:
            p.update({"to_out.weight": rng.standard_normal((h * d, c_out)), "to_out.bias": rng.standard_normal(c_out)})
        x = rng.standard_normal((2, 4, c))
        cfg["weights"] = rng.uniform(0.1, 0.4, (2, 4))
        out = oformer_attention(x, p, **cfg)
        assert out.shape == (2, 4, c_out), f"output width {out.shape[-1]} != out_channels {c_out}"
        errs.append(gradcheck(oformer_attention_forward, oformer_attention_backward,
                              Sample(inputs={"x": x}, params=p, config=cfg)).max_rel)
    return max(errs)


def _check_oformer_norm_axis(rng):
    # "points" standardises each channel over the points; "channels" each point over channels.
    s = _sample_oformer()(rng, "small")
    x, p = s.inputs["x"], s.params
    h, cfg = s.config["n_head"], dict(s.config)
    raw = split_heads((x @ p["to_qkv.weight"])[..., 2 * p["to_qkv.weight"].shape[1] // 3:], h)
    err = 0.0
    for axis_name, ax in (("points", 2), ("channels", 3)):
        cfg["norm_axis"] = axis_name
        _, c = oformer_attention_forward(x, p, **cfg)
        ref = (raw - raw.mean(ax, keepdims=True)) / np.sqrt(raw.var(ax, keepdims=True) + 1e-5)
        err = max(err, float(np.abs(c["hat"]["v"] - ref).max()))
    assert err < 1e-12, f"norm axis differs from the explicit normalisation: {err}"
    a = oformer_attention(x, p, **dict(cfg, norm_axis="points"))
    b = oformer_attention(x, p, **dict(cfg, norm_axis="channels"))
    assert np.abs(a - b).max() > 1e-3, "the two norm axes should give different results"
    return err


def _check_oformer_padding(rng):
    # Padded points change nothing: the masked layer equals the layer on the real points only.
    s = _sample_oformer(cross=True, padding=True)(rng, "small")
    out = oformer_attention(**s.inputs, params=s.params, **s.config)
    pm = s.config["padding_mask"]
    cfg = {k: v for k, v in s.config.items() if k != "padding_mask"}
    err = 0.0
    for bi in range(2):
        keep = pm[bi]
        ref = oformer_attention(s.inputs["x"][bi:bi + 1], s.params, s.inputs["z"][bi:bi + 1, keep], **cfg)
        err = max(err, float(np.abs(out[bi:bi + 1] - ref).max()))
    assert err < 1e-12, f"padding changes the result: {err}"
    return err


def _check_oformer_weights_placement(rng):
    # Uniform weights: both placements and the default 1/M agree; non-uniform: they differ.
    s = _sample_oformer()(rng, "small")
    n = s.inputs["x"].shape[1]
    base = oformer_attention(**s.inputs, params=s.params, **s.config)
    uni = np.full((2, n), 1.0 / n)
    a = oformer_attention(**s.inputs, params=s.params, **dict(s.config, weights=uni))
    b = oformer_attention(**s.inputs, params=s.params, **dict(s.config, weights=uni, weights_placement="output"))
    err = max(float(np.abs(a - base).max()), float(np.abs(b - base).max()))
    assert err < 1e-12, f"uniform weights disagree: {err}"
    w = rng.uniform(0.05, 0.3, (2, n))
    a = oformer_attention(**s.inputs, params=s.params, **dict(s.config, weights=w))
    b = oformer_attention(**s.inputs, params=s.params, **dict(s.config, weights=w, weights_placement="output"))
    assert np.abs(a - b).max() > 1e-3, "non-uniform weights: placements should differ"
    return err


def _check_oformer_rope_relative(rng):
    # RoPE makes Fourier scores depend on coordinates only through differences: shifting every
    # coordinate (queries and keys) leaves the output unchanged.
    s = _sample_oformer(attn_type="fourier", pos_mode="rope")(rng, "small")
    out = oformer_attention(**s.inputs, params=s.params, **s.config)
    cfg = dict(s.config, x_pos=s.config["x_pos"] + np.array([0.37, -1.2]))
    err = float(np.abs(oformer_attention(**s.inputs, params=s.params, **cfg) - out).max())
    assert err < 1e-11, f"RoPE output is not shift-invariant: {err}"
    return err


def _check_oformer_nonuniform_quadrature(rng):
    # Decoder cross-attention to a smooth input function sampled at the midpoints of the
    # non-uniform cells [(i/n)^2, ((i+1)/n)^2] (clustered near 0), with per-head LayerNorm over
    # d = 4 channels (pointwise, so the only point sum is the quadrature). With the cell widths as
    # "source" weights the output converges to the fine uniform reference at second order
    # (bound checked: 4 max|ref| / n^2; measured constant about 2); with the default 1/M it does
    # not converge (about 65% off), which is why weights matter on non-uniform meshes.
    def feats(t):
        return np.stack([np.sin(2 * np.pi * t), np.cos(np.pi * t), t ** 2, np.exp(-t)], -1)[None]
    p = oformer_init_params(rng, 4, 1, 4, cross=True, norm_type="layer", init_gain=0.7)
    x = rng.standard_normal((1, 5, 4))
    cfg = {"n_head": 1, "norm_type": "layer"}
    tf = (np.arange(8192) + 0.5) / 8192
    ref = oformer_attention(x, p, feats(tf), **cfg)
    scale = float(np.abs(ref).max())
    err = 0.0
    for n in (16, 32, 64):
        edges = (np.arange(n + 1) / n) ** 2
        t = 0.5 * (edges[1:] + edges[:-1])
        weighted = oformer_attention(x, p, feats(t), weights=np.diff(edges)[None], **cfg)
        plain = oformer_attention(x, p, feats(t), **cfg)
        err = float(np.abs(weighted - ref).max())
        assert err <= 4.0 * scale / n ** 2, f"n={n}: weighted quadrature error {err} above 4 max|ref|/n^2"
        assert np.abs(plain - ref).max() > 0.1 * scale, "unweighted 1/M should not converge here"
    return err


register(
    Mechanism(
        slug="oformer_attention", family="3-operator", tier="T1",
        title="OFormer linear attention (encoder), cross linear attention (decoder), InstanceNorm/RoPE conventions",
        paper="Li, Meidani, Barati Farimani, Transformer for PDEs' Operator Learning, TMLR 2023, arXiv 2205.13671",
        forward=oformer_attention_forward, backward=oformer_attention_backward,
        sample=_sample_oformer(), reference=_oformer_reference,
        docs="operator-attention.md#oformer-attention",
        checks={"variants_gradcheck": _check_oformer_variants_fd,
                "norm_axis_explicit": _check_oformer_norm_axis,
                "neuralop_layout_gradcheck": _check_oformer_neuralop_layout,
                "padding_equals_unpadded": _check_oformer_padding,
                "weights_placement": _check_oformer_weights_placement,
                "rope_shift_invariance": _check_oformer_rope_relative,
                "nonuniform_mesh_quadrature": _check_oformer_nonuniform_quadrature},
    ),
)
