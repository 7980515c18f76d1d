r"""Linformer: self-attention with sequence-axis low-rank projections of the keys and values.

Wang, Li, Khabsa, Fang, Ma, "Linformer: Self-Attention with Linear Complexity", 2020, arXiv
2006.04768. Follows facebookresearch/fairseq
``examples/linformer/linformer_src/modules/multihead_linear_attention.py@3d262bb25690e4eb2e7d3c1309b1e9c406ca4b99``
(``MultiheadLinearAttention``, self-attention path).

Forward
-------
For $X\in\mathbb R^{n\times C}$ and $H$ heads of width $d = C/H$, with projections
$E_h, F_h\in\mathbb R^{k\times n}$ along the *sequence* axis ($k$ = ``compress_seq_len``):

$$Q_h = (XW_Q + b_Q)_h,\qquad
K_h = \big((E_hX)W_K + b_K\big)_h,\qquad V_h = \big((F_hX)W_V + b_V\big)_h,$$
$$O_h = \mathrm{softmax}\big(s\,Q_hK_h^\top\big)V_h\in\mathbb R^{n\times d},\qquad
Y = [O_1,\dots,O_H]\,W_O + b_O,$$

$s = d^{-1/2}$. The score matrix is $n\times k$: cost $O(nk)$ instead of $O(n^2)$. fairseq compresses
the layer *input* before ``k_proj``/``v_proj`` (``compress_input=True``); the paper writes
$\mathrm{softmax}(Q(E_hK_h)^\top)F_hV_h$, compressing after the projection
(``compress_input=False``). The two differ only in the bias term ($b_K$ vs $(E_h\mathbf 1)b_K^\top$)
and agree exactly without biases (named check). A layer built for ``max_seq_len`` rows uses the first
$n$ columns of $E$ (fairseq ``compress_k.weight[:, 0:tgt_len]``).

Sharing (the paper's Section 4 options, keyword ``sharing``)
-------------------------------------------------------------
* ``"headwise"`` (default; fairseq ``shared_kv_compressed=0``): one $E$, one $F$ for all heads
  (``compress_k.weight``, ``compress_v.weight``);
* ``"key_value"`` (fairseq ``shared_kv_compressed=1``): $E = F$ for all heads
  (``compress_k.weight`` only);
* ``"layerwise"``: one matrix for keys and values *and* for all layers (fairseq
  ``shared_compress_layer``); within one layer it is ``"key_value"``; the cross-layer tie is the
  caller's (pass the same ``compress_k.weight`` to every layer and add the gradients);
* ``"none"``: a pair $E_h, F_h$ per head (``(H, max_seq_len, k)`` arrays) — the paper's unshared
  form, which fairseq does not offer.

Backward
--------
Chain rule through linear maps and the attention core. With $G_h = \partial L/\partial K_h$
(from `refattn.attention.softmax.core.attention_core_backward`) and, for ``compress_input``,
$\tilde X_h = E_hX$ (so $K_h = (\tilde X_hW_K + b_K)_h$):

$$d\tilde X_h = G_h W_{K,h}^\top,\quad dW_{K,h} = \textstyle\sum_b\tilde X_h^\top G_h,\quad
db_{K,h} = \textstyle\sum_{b,r}G_h,\quad dE_h = \textstyle\sum_b d\tilde X_h X^\top,\quad
dX \mathrel{+}= E_h^\top d\tilde X_h;$$

without ``compress_input``, $K_h = E_h\hat K_h$ with $\hat K = XW_K + b_K$:
$d\hat K_h = E_h^\top G_h$, $dE_h = \sum_b G_h\hat K_h^\top$. Shared matrices sum their gradients
over the heads (and over keys and values for ``"key_value"``). Parameters are stored transposed,
``compress_k.weight`` $= E^\top$ ``(max_seq_len, k)`` (torch's ``nn.Linear(max_seq_len, k).weight.T``),
so the gradient rows beyond $n$ are zero.

Conventions
-----------
``scale`` $= d^{-1/2}$ (fairseq ``q *= head_dim ** -0.5``); biases optional per projection (fairseq
``bias=True``); dropout, ``key_padding_mask``, ``add_bias_kv``, ``add_zero_attn``, incremental decoding
and encoder-decoder attention are not implemented (fairseq's Linformer encoder does not use them).

Agreement with upstream: fairseq is not installed, so ``MultiheadLinearAttention.forward``'s
self-attention path was transcribed line by line to PyTorch (float64, CPU; headwise and key-value
sharing, $n <$ ``max_seq_len``, 4 configurations): output 1.8e-15, every gradient <= 1.2e-15
relative; the ``k_proj.bias`` gradient is analytically zero (a shift shared by all keys cancels in
the softmax) and both sides give round-off below 2e-15.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["LINFORMER_SHARING", "linformer_attention_forward", "linformer_attention_backward",
           "linformer_attention", "init_linformer_params"]

LINFORMER_SHARING = ("headwise", "key_value", "layerwise", "none")
_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def _compress_keys(sharing):
    """The params keys of the sequence projections: ``("compress_k", "compress_v")`` or ``("compress_k",)``."""
    return ("compress_k", "compress_v") if sharing in ("headwise", "none") else ("compress_k",)


def init_linformer_params(rng, embed_dim: int, num_heads: int, max_seq_len: int, compress_seq_len: int, *,
                          sharing: str = "headwise", bias: bool = True) -> dict:
    """Random Linformer parameters (PyTorch ``nn.Linear`` default initialisation, weights ``(in, out)``)."""
    check_choice(sharing, "sharing", LINFORMER_SHARING)
    p = {}
    for name in _PROJ:
        bound = 1.0 / np.sqrt(embed_dim)
        p[f"{name}.weight"] = rng.uniform(-bound, bound, (embed_dim, embed_dim))
        if bias:
            p[f"{name}.bias"] = rng.uniform(-bound, bound, embed_dim)
    lead = (num_heads,) if sharing == "none" else ()
    for key in _compress_keys(sharing):
        bound = 1.0 / np.sqrt(max_seq_len)
        p[f"{key}.weight"] = rng.uniform(-bound, bound, lead + (max_seq_len, compress_seq_len))
    return p


def _validate(x, params, num_heads, sharing, compress_input, scale):
    x = as_float(x, "x", ndim=3)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    check_choice(sharing, "sharing", LINFORMER_SHARING)
    if not isinstance(compress_input, (bool, np.bool_)):
        raise TypeError(f"compress_input must be a bool; got {type(compress_input).__name__}")
    scale = check_positive(scale, "scale", allow_none=True)
    c = x.shape[-1]
    if c % num_heads:
        raise ValueError(f"the embedding size of x ({c}, axis -1) must be a multiple of num_heads={num_heads}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    ck = params.get("compress_k.weight")
    if ck is None or np.ndim(ck) != (3 if sharing == "none" else 2):
        want = "(num_heads, max_seq_len, k)" if sharing == "none" else "(max_seq_len, k)"
        raise ValueError(f"params['compress_k.weight'] must be an array of shape {want} for sharing={sharing!r}; "
                         f"got {None if ck is None else np.shape(ck)}")
    max_len, kc = np.shape(ck)[-2:]
    if x.shape[1] > max_len:
        raise ValueError(f"x has {x.shape[1]} tokens (axis 1) but compress_k.weight holds max_seq_len={max_len} rows")
    spec = {}
    for name in _PROJ:
        spec.update(linear_prefixed_spec(name, c, c))
    lead = (num_heads,) if sharing == "none" else ()
    for key in _compress_keys(sharing):
        spec[f"{key}.weight"] = lead + (max_len, kc)
    p = check_params(params, spec, optional=[f"{n}.bias" for n in _PROJ], where="linformer_attention")
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads, scale


def _seq_proj(p, key, n, num_heads):
    """``(H', n, k)`` transposed projection $E^\\top$ restricted to the first ``n`` positions (H' = 1 or H)."""
    w = p[f"{key}.weight"][..., :n, :]
    return w[None] if w.ndim == 2 else w


def _head_weight(p, name, num_heads):
    """``W (C, C) -> (H, C, d)`` and ``b -> (H, 1, d)`` (or None): the columns of each head."""
    w = p[f"{name}.weight"]
    c = w.shape[0]
    wh = np.moveaxis(w.reshape(c, num_heads, -1), 1, 0)
    b = p.get(f"{name}.bias")
    return wh, None if b is None else b.reshape(num_heads, 1, -1)


def _compressed(x, p, name, key, num_heads, compress_input):
    """Keys or values of every head, ``(B, H, k, d)``, and what their backward needs."""
    n = x.shape[1]
    et = _seq_proj(p, key, n, num_heads)  # (H', n, k)
    wh, bh = _head_weight(p, name, num_heads)
    if compress_input:
        xt = np.einsum("hnk,bnc->bhkc", et, x)  # (B, H', k, C) = E_h X
        out = np.einsum("bhkc,hcd->bhkd", xt, wh) if xt.shape[1] == num_heads else xt @ wh[None]
        if bh is not None:
            out = out + bh
        return out, {"xt": xt, "et": et}
    full = split_heads(linear_prefixed(p, name, x), num_heads)  # (B, H, n, d)
    out = np.einsum("hnk,bhnd->bhkd", et, full)
    return out, {"full": full, "et": et}


def _compressed_vjp(g, x, p, grads, name, key, num_heads, compress_input, st):
    """Adds the gradients of ``name`` and ``key`` into ``grads`` and returns ``dx`` for ``g (B, H, k, d)``."""
    et = st["et"]
    shared = et.shape[0] == 1
    if compress_input:
        wh, bh = _head_weight(p, name, num_heads)
        xt = st["xt"]
        if shared:  # one compressed input for all heads: back to the merged (B, k, C) layout
            gm = merge_heads(g)  # (B, k, C)
            dxt = linear_prefixed_vjp(grads, p, name, gm, xt[:, 0])[:, None]
        else:
            dxt = np.einsum("bhkd,hcd->bhkc", g, wh)
            dw = np.einsum("bhkc,bhkd->hcd", xt, g)  # per head columns
            dwf = np.moveaxis(dw, 0, 1).reshape(wh.shape[1], -1)
            grads[f"{name}.weight"] = grads.get(f"{name}.weight", 0) + dwf
            if bh is not None:
                grads[f"{name}.bias"] = grads.get(f"{name}.bias", 0) + np.sum(g, axis=(0, 2)).reshape(-1)
        det = np.einsum("bhkc,bnc->hnk", dxt, x)
        dx = np.einsum("hnk,bhkc->bnc", et, dxt)
    else:
        full = st["full"]
        dfull = np.einsum("hnk,bhkd->bhnd", et, g)
        det = np.einsum("bhkd,bhnd->hnk", g, full)
        if shared:
            det = np.sum(det, axis=0, keepdims=True)
        dx = linear_prefixed_vjp(grads, p, name, merge_heads(dfull), x)
    w = p[f"{key}.weight"]
    dfull_w = np.zeros(w.shape, dtype=w.dtype)
    dfull_w[..., : det.shape[1], :] = det[0] if w.ndim == 2 else det
    grads[f"{key}.weight"] = grads.get(f"{key}.weight", 0) + dfull_w
    return dx


def linformer_attention_forward(x, params, *, num_heads: int, sharing: str = "headwise",
                                compress_input: bool = True, scale=None):
    r"""Linformer multi-head self-attention (fairseq ``MultiheadLinearAttention``, self-attention path).

    Parameters
    ----------
    x : (B, N, C)
        Token-major input; ``N`` at most the projections' ``max_seq_len``.
    params : dict
        ``{q,k,v,out}_proj.weight (C, C)`` (torch ``weight.T``) and optional ``.bias (C,)``;
        ``compress_k.weight`` $= E^\top$ ``(max_seq_len, k)`` and, for ``sharing="headwise"``,
        ``compress_v.weight`` $= F^\top$; for ``sharing="none"`` both are ``(H, max_seq_len, k)``.
    num_heads : int
        ``C`` must be a multiple of it.
    sharing : {"headwise", "key_value", "layerwise", "none"}
        Which projections are shared (module docstring).
    compress_input : bool
        Compress the input before ``k_proj``/``v_proj`` (fairseq, default) or the projected keys
        and values (the paper's $E_hK_h$).
    scale : float > 0, optional
        Score scale; default $d^{-1/2}$.

    Returns
    -------
    out : (B, N, C), cache
    """
    x, p, h, scale = _validate(x, params, num_heads, sharing, compress_input, scale)
    ci = bool(compress_input)
    q = split_heads(linear_prefixed(p, "q_proj", x), h)
    vkey = "compress_v" if "compress_v.weight" in p else "compress_k"
    k, kst = _compressed(x, p, "k_proj", "compress_k", h, ci)
    v, vst = _compressed(x, p, "v_proj", vkey, h, ci)
    ctx, core = attention_core_forward(q, k, v, scale=scale)
    merged = merge_heads(ctx)
    out = linear_prefixed(p, "out_proj", merged)
    cache = {"x": x, "p": p, "h": h, "ci": ci, "vkey": vkey, "kst": kst, "vst": vst, "core": core,
             "merged": merged, "out_shape": out.shape}
    return out, cache


def linformer_attention_backward(dout, cache):
    r"""Gradients ``{"x"}`` and of every params key of `linformer_attention_forward` (chain rule
    through the projections and the attention core; module docstring)."""
    x, p, h, ci = cache["x"], cache["p"], cache["h"], cache["ci"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads: dict = {}
    dmerged = linear_prefixed_vjp(grads, p, "out_proj", g, cache["merged"])
    dcore = attention_core_backward(split_heads(dmerged, h), cache["core"])
    dx = linear_prefixed_vjp(grads, p, "q_proj", merge_heads(dcore["q"]), x)
    dx = dx + _compressed_vjp(dcore["k"], x, p, grads, "k_proj", "compress_k", h, ci, cache["kst"])
    dx = dx + _compressed_vjp(dcore["v"], x, p, grads, "v_proj", cache["vkey"], h, ci, cache["vst"])
    grads["x"] = dx
    return {k: np.asarray(v, dtype=x.dtype) for k, v in grads.items()}


def linformer_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `linformer_attention_forward`."""
    return linformer_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(x, params, *, num_heads, sharing="headwise", compress_input=True, scale=None):
    """Per (batch, head) loops of the formulas: $E_h$, $F_h$ as explicit $k\\times n$ matrices."""
    b, n, c = x.shape
    d = c // num_heads
    s = d ** -0.5 if scale is None else scale

    def lin(name, a):
        out = a @ params[f"{name}.weight"]
        return out + params[f"{name}.bias"] if f"{name}.bias" in params else out

    def seq(key, hh):
        w = params[f"{key}.weight"]
        return (w[hh] if w.ndim == 3 else w)[:n].T  # (k, n)

    vkey = "compress_v" if "compress_v.weight" in params else "compress_k"
    out = np.zeros((b, n, c))
    for bi in range(b):
        heads = []
        for hh in range(num_heads):
            cols = slice(hh * d, (hh + 1) * d)
            q = lin("q_proj", x[bi])[:, cols]
            e, f = seq("compress_k", hh), seq(vkey, hh)
            if compress_input:
                k, v = lin("k_proj", e @ x[bi])[:, cols], lin("v_proj", f @ x[bi])[:, cols]
            else:
                k, v = e @ lin("k_proj", x[bi])[:, cols], f @ lin("v_proj", x[bi])[:, cols]
            sc = s * q @ k.T
            w = np.exp(sc - sc.max(axis=1, keepdims=True))
            heads.append((w / w.sum(axis=1, keepdims=True)) @ v)
        out[bi] = lin("out_proj", np.concatenate(heads, axis=1))
    return out


def _draw(rng, size, sharing=None, compress_input=None, bias=True):
    n = 4 if size == "tiny" else int(rng.integers(8, 13))
    c, h = (4, 2) if size == "tiny" else (8, 2)
    max_len, kc = (n + 1, 3) if size == "tiny" else (16, 5)
    sharing = LINFORMER_SHARING[int(rng.integers(0, 4))] if sharing is None else sharing
    ci = bool(rng.integers(0, 2)) if compress_input is None else compress_input
    params = init_linformer_params(rng, c, h, max_len, kc, sharing=sharing, bias=bias)
    params = {k: 2.0 * v for k, v in params.items()}  # O(1) scores, so the softmax is not uniform
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params,
                  config={"num_heads": h, "sharing": sharing, "compress_input": ci})


def _sample(rng, size):
    return _draw(rng, size)


def _check_identity_projection_is_mha(rng):
    """E = F = I (k = n): Linformer is plain multi-head softmax attention (the catalogue's test)."""
    s = _draw(rng, "small", sharing="headwise")
    x, p = s.inputs["x"], dict(s.params)
    n = x.shape[1]
    p["compress_k.weight"] = np.eye(p["compress_k.weight"].shape[0], n)  # E^T = [I; 0]: k = n
    p["compress_v.weight"] = np.eye(p["compress_v.weight"].shape[0], n)
    a = linformer_attention(x, p, **s.config)
    h = s.config["num_heads"]
    q, k, v = (split_heads(linear_prefixed(p, f"{nm}_proj", x), h) for nm in "qkv")
    b = linear_prefixed(p, "out_proj", merge_heads(attention_core_forward(q, k, v)[0]))
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12, f"E = F = I differs from multi-head attention by {err}"
    return err


def _check_orders_agree_without_bias(rng):
    """Without biases, compressing the input (fairseq) equals compressing the keys and values (paper)."""
    err = 0.0
    for sharing in LINFORMER_SHARING:
        s = _draw(rng, "small", sharing=sharing, bias=False)
        cfg = dict(s.config)
        cfg.pop("compress_input")
        a = linformer_attention(s.inputs["x"], s.params, compress_input=True, **cfg)
        b = linformer_attention(s.inputs["x"], s.params, compress_input=False, **cfg)
        err = max(err, float(np.max(np.abs(a - b))))
    assert err < 1e-12, f"input and key/value compression differ without biases: {err}"
    return err


def _check_sharing_reductions(rng):
    """Per-head matrices all equal to one E, F give the headwise layer; headwise with F = E gives key_value."""
    s = _draw(rng, "small", sharing="headwise")
    x, p, h = s.inputs["x"], s.params, s.config["num_heads"]
    ci = s.config["compress_input"]
    base = linformer_attention(x, p, num_heads=h, sharing="headwise", compress_input=ci)
    pn = dict(p)
    pn["compress_k.weight"] = np.stack([p["compress_k.weight"]] * h)
    pn["compress_v.weight"] = np.stack([p["compress_v.weight"]] * h)
    err = float(np.max(np.abs(linformer_attention(x, pn, num_heads=h, sharing="none", compress_input=ci) - base)))
    pk = {k: v for k, v in p.items() if k != "compress_v.weight"}
    ph = dict(p, **{"compress_v.weight": p["compress_k.weight"]})
    kv = linformer_attention(x, pk, num_heads=h, sharing="key_value", compress_input=ci)
    err = max(err, float(np.max(np.abs(kv - linformer_attention(x, ph, num_heads=h, sharing="headwise",
                                                                  compress_input=ci)))))
    assert err < 1e-12, f"sharing reductions differ: {err}"
    return err


def _check_low_rank_rate(rng):
    """The paper's Theorem 1 construction (fixed seeds): $\\tilde P = PR^\\top R$ with $R$ a $k\\times n$
    Gaussian matrix of variance $1/k$ approximates $PV$ with a relative error that falls like
    $k^{-1/2}$ (Johnson-Lindenstrauss): the fitted log-log slope over k = 8..512 lies in [-0.6, -0.4]."""
    rng = np.random.default_rng(11)
    n = 128
    q, kk, v = (rng.standard_normal((n, 8)) for _ in range(3))
    sc = q @ kk.T / np.sqrt(8)
    pm = np.exp(sc - sc.max(1, keepdims=True))
    pm /= pm.sum(1, keepdims=True)
    exact = pm @ v
    ks = np.array([8, 32, 128, 512])
    errs = []
    for k in ks:
        vals = []
        for _ in range(6):
            r = rng.standard_normal((k, n)) / np.sqrt(k)
            vals.append(np.linalg.norm(pm @ (r.T @ (r @ v)) - exact) / np.linalg.norm(exact))
        errs.append(np.mean(vals))
    slope = float(np.polyfit(np.log(ks), np.log(errs), 1)[0])
    assert -0.6 <= slope <= -0.4, f"low-rank error slope {slope} (errors {errs}); expected about -1/2"
    return abs(slope + 0.5)


def _check_gradcheck_options(rng):
    """Random-direction gradient checks for every sharing option and compression order (the generated
    test runs the full finite-difference Jacobian on one drawn combination)."""
    from ...testing import directional_check  # lazy: testing imports the registry

    err = 0.0
    for sh in LINFORMER_SHARING:
        for ci in (True, False):
            err = max(err, directional_check(linformer_attention_forward, linformer_attention_backward,
                                             _draw(rng, "small", sharing=sh, compress_input=ci,
                                                   bias=bool(rng.integers(0, 2)))).max_rel)
    return err


register(
    Mechanism(
        slug="linformer_low_rank_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Linformer (sequence-axis low-rank projections)",
        paper="Wang, Li, Khabsa, Fang, Ma, 'Linformer: Self-Attention with Linear Complexity', 2020, "
              "arXiv 2006.04768",
        forward=linformer_attention_forward, backward=linformer_attention_backward, sample=_sample,
        reference=_reference,
        checks={"identity_projection_is_mha": _check_identity_projection_is_mha,
                "input_and_kv_compression_agree_without_bias": _check_orders_agree_without_bias,
                "sharing_reductions": _check_sharing_reductions,
                "low_rank_error_rate_k_minus_half": _check_low_rank_rate,
                "directional_gradcheck_sharing_options": _check_gradcheck_options},
        docs="linear/low-rank-and-structured.md#linformer",
    ),
)
