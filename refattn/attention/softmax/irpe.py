r"""iRPE: image relative position encodings (bias and contextual modes on queries, keys and values).

Paper: Wu, Peng, Chen, Fu, Chao, "Rethinking and Improving Relative Position Encoding for Vision
Transformer", ICCV 2021, arXiv 2107.14222. Upstream: microsoft/Cream ``iRPE/DeiT-with-iRPE/irpe.py``
and ``rpe_vision_transformer.py`` @4a13c4091e78f9abd2160e7e01c02e48c1cf8fb9 (``piecewise_index``,
``_rp_2d_*``, ``get_bucket_ids_2d``, ``iRPE``, ``iRPE_Cross``, ``get_rpe_config``, ``RPEAttention``).

Bucket index
------------
Tokens sit on an $h\times w$ grid after ``skip`` extra tokens (a class token: ``skip = 1``). For
two grid tokens the offset is $(\Delta r, \Delta c) = p_i - p_j$. The piecewise index of the
paper's Eq. (18), with $\alpha = r$, $\beta = 2r$, $\gamma = 8r$ for ``ratio`` $r$ (1.9):

$$g(x) = \begin{cases}[x] & |x|\le\alpha\\
\mathrm{sign}(x)\,\min\Big(\beta,\ \Big[\alpha + \frac{\ln(|x|/\alpha)}{\ln(\gamma/\alpha)}(\beta-\alpha)\Big]\Big) & |x| > \alpha,\end{cases}$$

truncated to an integer in $[-\lfloor\beta\rfloor, \lfloor\beta\rfloor]$ ($[\cdot]$ rounds half to even).
The log branch is evaluated in float32, as upstream (a long tensor divided by a Python float is
float32 in PyTorch's default dtype), so the buckets equal upstream's bit for bit. Methods:
``"euc"`` $g(\mathrm{round}\sqrt{\Delta r^2+\Delta c^2})$, ``"quant"`` $g(\Delta r^2+\Delta c^2)$,
``"cross"`` separate tables for $g(\Delta r)$ and $g(\Delta c)$ whose encodings add,
``"product"`` $(g(\Delta r)+\lfloor\beta\rfloor)(2\lfloor\beta\rfloor+1) + g(\Delta c)+\lfloor\beta\rfloor$
(the paper's best); the others add $\lfloor\beta\rfloor$. Pairs involving a skip token use one extra
bucket. `irpe_bucket_ids` computes the ``(N, N)`` map.

Attention (``RPEAttention``)
----------------------------
$q, k, v$ from ``qkv`` (``(C, 3C)``, torch ``weight.T``), heads of width $d$, $s = d^{-1/2}$:

$$e_{ij} = s\,q_i\cdot k_j + b^K_{ij} + b^Q_{ij},\qquad
y_i = \sum_j \alpha_{ij}v_j + \sum_j\alpha_{ij}\,r^V_{I_{ij}},\qquad \alpha = \mathrm{softmax}(e),$$

* bias mode: $b^K_{ij} = \beta^K_{h,I_{ij}}$, $b^Q_{ij} = \beta^Q_{h,I_{ji}}$ (``lookup_table_bias (H', nb)``);
* contextual mode: $b^K_{ij} = (s\,q_i)\cdot r^K_{h,:,I_{ij}}$, $b^Q_{ij} = (s\,k_j)\cdot r^Q_{h,:,I_{ji}}$
  (``lookup_table_weight (H', d, nb)``; upstream applies them to the *scaled* q and k);
* values (contextual only; ``mode="bias"`` with a value target raises, as upstream):
  ``rpe_v.lookup_table_weight (H', nb, d)``.

$H' = 1$ with ``shared_head=True`` (upstream default), else $H$. ``rpe_on`` picks the targets
(``"k"`` default, ``"q"``, ``"v"``, ``"qk"``, ``"qkv"``); parameters are named like the upstream
``state_dict`` (``rpe_k.lookup_table_weight``; cross: ``rpe_k.rp_rows.*`` and ``rpe_k.rp_cols.*``).
Then $y$ goes through ``proj``. The contextual term is computed as upstream: $qa = (sq)\,r^K$ for
all buckets (``(N, nb)`` per head), then gathered, never an $N\times N\times d$ tensor.

Backward (derivation)
---------------------
The attention VJP (`refattn.attention.softmax.attention_core_backward`, with the extra
$dP_{ij} \mathrel{+}= (G\,(r^V)^\top)_{i,I_{ij}}$ of the value term) gives $dS$ (= $db^K$, and
$db^Q = dS^\top$ per head). Then with the one-hot bucket map $O_{ijc} = [I_{ij} = c]$:
$d(qa)_{ic} = \sum_j dS_{ij}O_{ijc}$, $d(sq) \mathrel{+}= d(qa)(r^K)^\top$, $dr^K = \sum (sq)^\top d(qa)$
(summed over heads when shared); bias mode $d\beta_{hc} = \sum_{ij} dS_{hij}O_{ijc}$ (the scatter-add);
values $dr^V = \sum W^\top G$ with $W_{ic} = \sum_j\alpha_{ij}O_{ijc}$. The bucket map is a fixed
selection (not differentiated).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "IRPE_METHODS",
    "IRPE_MODES",
    "IRPE_TARGETS",
    "irpe_piecewise_index",
    "irpe_coefficients",
    "irpe_num_buckets",
    "irpe_bucket_ids",
    "irpe_param_spec",
    "init_irpe_params",
    "irpe_attention_forward",
    "irpe_attention_backward",
    "irpe_attention",
]

IRPE_METHODS = ("euc", "quant", "cross", "product")
IRPE_MODES = ("bias", "contextual")
IRPE_TARGETS = ("q", "k", "v", "qk", "qkv")


# --------------------------------------------------------------------------------------------
# Buckets


def irpe_coefficients(ratio: float = 1.9) -> tuple[float, float, float]:
    """$(\\alpha, \\beta, \\gamma) = (r, 2r, 8r)$ (``get_single_rpe_config``)."""
    return 1.0 * ratio, 2.0 * ratio, 8.0 * ratio


def irpe_piecewise_index(relative_position, alpha: float, beta: float, gamma: float) -> np.ndarray:
    """Eq. (18) on integer or float relative positions (see the module docstring), int64, float32 log branch."""
    rp = np.asarray(relative_position)
    is_float = rp.dtype.kind == "f"
    a32 = np.float32(alpha)
    absf = np.abs(rp).astype(np.float32)
    outside = np.abs(rp) > alpha
    safe = np.where(outside, absf, a32)                                 # the log is only read outside
    v = a32 + np.log(safe / a32) / np.float32(math.log(gamma / alpha)) * np.float32(beta - alpha)
    v = np.minimum(np.round(v), np.float32(beta)) * np.sign(rp).astype(np.float32)
    inside = np.round(rp).astype(np.int64) if is_float else rp.astype(np.int64)
    return np.where(outside, np.trunc(v).astype(np.int64), inside)


def irpe_num_buckets(method: str, beta: float, skip: int = 0) -> int:
    """Buckets per table: $(2\\lfloor\\beta\\rfloor+1)^2$ for product, $2\\lfloor\\beta\\rfloor+1$ otherwise; +1 with skip tokens."""
    b = int(beta)
    return (2 * b + 1) ** (2 if method == "product" else 1) + (1 if skip > 0 else 0)


def irpe_bucket_ids(method: str, height: int, width: int, *, skip: int = 0, ratio: float = 1.9, part: str = "rows"):
    """``(N, N)`` int bucket map of ``get_bucket_ids_2d`` (``N = skip + height * width``), row-major grid;
    for ``method="cross"``, ``part`` chooses the ``"rows"`` or ``"cols"`` table's map."""
    check_choice(method, "method", IRPE_METHODS)
    alpha, beta, gamma = irpe_coefficients(ratio)
    r, c = np.divmod(np.arange(height * width), width)
    dr, dc = r[:, None] - r[None], c[:, None] - c[None]
    b = int(beta)
    if method == "euc":
        dis = np.round(np.sqrt((dr * dr + dc * dc).astype(np.float32)))
        ids = irpe_piecewise_index(dis, alpha, beta, gamma) + b
    elif method == "quant":
        ids = irpe_piecewise_index(dr * dr + dc * dc, alpha, beta, gamma) + b
    elif method == "cross":
        ids = irpe_piecewise_index(dr if part == "rows" else dc, alpha, beta, gamma) + b
    else:
        ids = (irpe_piecewise_index(dr, alpha, beta, gamma) + b) * (2 * b + 1) + irpe_piecewise_index(dc, alpha, beta,
                                                                                                      gamma) + b
    if skip > 0:
        full = np.full((skip + height * width,) * 2, irpe_num_buckets(method, beta), dtype=np.int64)
        full[skip:, skip:] = ids
        ids = full
    return ids


# --------------------------------------------------------------------------------------------
# Parameters


def _targets(rpe_on):
    check_choice(rpe_on, "rpe_on", IRPE_TARGETS)
    return tuple(t for t in "qkv" if t in rpe_on)


def _table_names(method, t, mode):
    leaf = "lookup_table_bias" if mode == "bias" and t != "v" else "lookup_table_weight"
    parts = ("rp_rows.", "rp_cols.") if method == "cross" else ("",)
    return tuple(f"rpe_{t}.{part}{leaf}" for part in parts)


def irpe_param_spec(dim: int, num_heads: int, *, method: str = "product", mode: str = "contextual", rpe_on: str = "k",
                    ratio: float = 1.9, skip: int = 0, shared_head: bool = True) -> tuple[dict, tuple]:
    """``(spec, optional)``: ``RPEAttention`` names and shapes (``qkv``/``proj`` weights ``(in, out)``)."""
    check_choice(mode, "mode", IRPE_MODES)
    if mode == "bias" and "v" in _targets(rpe_on):
        raise ValueError(f"mode='bias' has no value encoding (upstream: 'Bias non-transposed RPE does not exist'); "
                         f"got rpe_on={rpe_on!r}: use mode='contextual' or rpe_on in ('q', 'k', 'qk')")
    c, d = dim, dim // num_heads
    hp = 1 if shared_head else num_heads
    nb = irpe_num_buckets(method, irpe_coefficients(ratio)[1], skip)
    spec = {"qkv.weight": (c, 3 * c), "qkv.bias": (3 * c,)}
    for t in _targets(rpe_on):
        for name in _table_names(method, t, mode):
            spec[name] = (hp, nb, d) if t == "v" else ((hp, nb) if mode == "bias" else (hp, d, nb))
    spec.update({"proj.weight": (c, c), "proj.bias": (c,)})
    return spec, ("qkv.bias",)


def init_irpe_params(rng, dim: int, num_heads: int, *, qkv_bias: bool = True, table_scale: float = 0.5,
                     **config) -> dict:
    """Random parameters for `irpe_param_spec` (``config`` as its keywords); tables $\\mathcal N(0, s^2)$
    (upstream initialises them to zero)."""
    spec, _ = irpe_param_spec(dim, num_heads, **config)
    p = {}
    for k, shp in spec.items():
        if k == "qkv.bias" and not qkv_bias:
            continue
        if ".lookup_table" in k:
            p[k] = table_scale * rng.standard_normal(shp)
        elif len(shp) == 2:
            p[k] = rng.uniform(-1.0, 1.0, shp) / math.sqrt(shp[0])
        else:
            p[k] = 0.1 * rng.standard_normal(shp)
    return p


# --------------------------------------------------------------------------------------------
# The layer


def irpe_attention_forward(x, params, *, num_heads: int, height=None, width=None, method: str = "product",
                           mode: str = "contextual", rpe_on: str = "k", ratio: float = 1.9, shared_head: bool = True,
                           scale=None):
    r"""DeiT attention with iRPE (``RPEAttention``; see the module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        ``N = skip + height * width`` tokens, the skip tokens (class token) first.
    params : dict
        Keys of `irpe_param_spec` (``qkv.bias`` optional).
    num_heads : int
    height, width : int, optional
        The grid; default (as upstream) $h = w = \lfloor\sqrt N\rfloor$ and ``skip = N - h w``.
    method : {"euc", "quant", "cross", "product"}
    mode : {"bias", "contextual"}
        For q/k targets; the value target exists only in contextual mode.
    rpe_on : {"q", "k", "v", "qk", "qkv"}
    ratio : float
        $\alpha, \beta, \gamma = r, 2r, 8r$ (1.9).
    shared_head : bool
        One table for all heads (default) or one per head.
    scale : float, optional
        Default $d^{-1/2}$.

    Returns
    -------
    out, cache
        ``out (B, N, C)``.
    """
    x = as_float(x, "x", ndim=3)
    n, c = x.shape[1:]
    nh = check_size(num_heads, "num_heads")
    if c % nh:
        raise ValueError(f"channels of x ({c}) must be divisible by num_heads ({nh})")
    check_choice(method, "method", IRPE_METHODS)
    check_choice(mode, "mode", IRPE_MODES)
    targets = _targets(rpe_on)
    if height is None and width is None:
        height = width = int(math.isqrt(n))
    height, width = check_size(height, "height"), check_size(width, "width")
    skip = n - height * width
    if skip < 0:
        raise ValueError(f"x has N={n} tokens, fewer than height * width = {height * width}")
    ratio = check_positive(ratio, "ratio")
    if int(2 * ratio) < 1:
        raise ValueError(f"ratio must be >= 0.5 (beta = 2 * ratio >= 1 bucket each side); got {ratio}")
    if not isinstance(shared_head, (bool, np.bool_)):
        raise TypeError(f"shared_head must be a bool; got {type(shared_head).__name__}")
    scale = check_positive(scale, "scale", allow_none=True)
    spec, optional = irpe_param_spec(c, nh, method=method, mode=mode, rpe_on=rpe_on, ratio=ratio, skip=skip,
                                     shared_head=bool(shared_head))
    p = check_params(params, spec, optional=optional, where=f"irpe_attention ({method}, {mode}, rpe_on={rpe_on!r})")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    d = c // nh
    s = float(d ** -0.5) if scale is None else scale
    nb = irpe_num_buckets(method, irpe_coefficients(ratio)[1], skip)
    parts = ("rows", "cols") if method == "cross" else ("rows",)
    onehots = [(irpe_bucket_ids(method, height, width, skip=skip, ratio=ratio, part=pt)[..., None]
                == np.arange(nb)).astype(dt) for pt in parts]                     # (N, N, nb) each
    qkv = linear_apply(x, p["qkv.weight"], p.get("qkv.bias"))
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))  # (B, H, N, d)
    qs, ks = q * s, k * s
    bias = None
    for t, src in (("k", qs), ("q", ks)):
        if t not in targets:
            continue
        for name, oh in zip(_table_names(method, t, mode), onehots):
            if mode == "bias":
                b_ = np.einsum("hc,ijc->hij", p[name], oh)                        # (H', N, N)
            else:
                b_ = np.einsum("bhic,ijc->bhij", src @ p[name], oh)               # (B, H, N, N)
            b_ = b_ if t == "k" else np.swapaxes(b_, -1, -2)
            bias = b_ if bias is None else bias + b_
    o, core = attention_core_forward(qs, k, v, bias, scale=1.0)
    wv = []
    if "v" in targets:
        for name, oh in zip(_table_names(method, "v", mode), onehots):
            w_ = np.einsum("bhij,ijc->bhic", core["p"], oh)                        # (B, H, N, nb)
            o = o + w_ @ p[name]
            wv.append(w_)
    om = merge_heads(o)
    y = linear_apply(om, p["proj.weight"], p["proj.bias"])
    return y, {"x": x, "p": p, "qs": qs, "ks": ks, "core": core, "onehots": onehots, "wv": wv, "om": om, "s": s,
               "nh": nh, "targets": targets, "method": method, "mode": mode, "shape": y.shape}


def irpe_attention_backward(dout, cache):
    """Gradient of :func:`irpe_attention_forward`: ``x`` and every parameter."""
    p, x, nh, s = cache["p"], cache["x"], cache["nh"], cache["s"]
    method, mode, targets, onehots = cache["method"], cache["mode"], cache["targets"], cache["onehots"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    lo = linear_vjp(g, cache["om"], p["proj.weight"])
    grads["proj.weight"], grads["proj.bias"] = lo["weight"], lo["bias"]
    do = split_heads(lo["x"], nh)
    dp = None
    if "v" in targets:
        for name, oh, w_ in zip(_table_names(method, "v", mode), onehots, cache["wv"]):
            gt = np.einsum("bhic,bhid->hcd", w_, do)
            grads[name] = gt.sum(0, keepdims=True) if p[name].shape[0] == 1 else gt
            dpv = np.einsum("bhid,hcd,ijc->bhij", do, np.broadcast_to(p[name], (nh,) + p[name].shape[1:]), oh)
            dp = dpv if dp is None else dp + dpv
    gc = attention_core_backward(do, cache["core"], dp=dp)
    dqs, dk, dv = gc["q"], gc["k"], gc["v"]
    dks = np.zeros_like(dk)
    ds = gc.get("bias")
    for t, src in (("k", cache["qs"]), ("q", cache["ks"])):
        if t not in targets:
            continue
        dst = ds if t == "k" else np.swapaxes(ds, -1, -2)                       # d(bias before any transpose)
        for name, oh in zip(_table_names(method, t, mode), onehots):
            if mode == "bias":
                gt = np.einsum("...hij,ijc->hc", dst, oh)
                grads[name] = gt.sum(0, keepdims=True) if p[name].shape[0] == 1 else gt
            else:
                da = np.einsum("bhij,ijc->bhic", np.broadcast_to(dst, src.shape[:-1] + (src.shape[-2],)), oh)
                gt = np.einsum("bhid,bhic->hdc", src, da)
                grads[name] = gt.sum(0, keepdims=True) if p[name].shape[0] == 1 else gt
                dsrc = da @ np.swapaxes(np.broadcast_to(p[name], (nh,) + p[name].shape[1:]), -1, -2)
                if t == "k":
                    dqs = dqs + dsrc
                else:
                    dks = dks + dsrc
    dq, dk = s * dqs, dk + s * dks
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    lq = linear_vjp(dqkv, x, p["qkv.weight"], "qkv.bias" in p)
    grads["qkv.weight"] = lq["weight"]
    if "qkv.bias" in p:
        grads["qkv.bias"] = lq["bias"]
    return {"x": lq["x"], **{k_: grads[k_] for k_ in p}}


def irpe_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`irpe_attention_forward`."""
    return irpe_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, method=None, mode=None, rpe_on=None):
    method = method or str(rng.choice(IRPE_METHODS))
    mode = mode or str(rng.choice(IRPE_MODES))
    rpe_on = rpe_on or str(rng.choice(IRPE_TARGETS if mode == "contextual" else ("q", "k", "qk")))
    if size == "tiny":
        hh, ww, skip, c, nh, ratio = 2, 2, 1, 4, 2, 0.5
    else:
        hh, ww, skip, c, nh, ratio = int(rng.integers(3, 5)), int(rng.integers(3, 5)), int(rng.integers(0, 2)), 6, 2, 1.5
    cfg = {"num_heads": nh, "height": hh, "width": ww, "method": method, "mode": mode, "rpe_on": rpe_on,
           "ratio": ratio, "shared_head": bool(rng.random() < 0.5)}
    p = init_irpe_params(rng, c, nh, qkv_bias=bool(rng.random() < 0.5), method=method, mode=mode, rpe_on=rpe_on,
                         ratio=ratio, skip=skip, shared_head=cfg["shared_head"])
    return Sample(inputs={"x": rng.standard_normal((2, skip + hh * ww, c))}, params=p, config=cfg)


def _reference(x, params, *, num_heads, height=None, width=None, method="product", mode="contextual", rpe_on="k",
               ratio=1.9, shared_head=True, scale=None):
    # Per batch, head and pair: e_ij = s q.k + bias/contextual terms read at the pair's bucket(s).
    b, n, c = x.shape
    if height is None:
        height = width = math.isqrt(n)
    skip = n - height * width
    d = c // num_heads
    s = d ** -0.5 if scale is None else scale
    parts = ("rows", "cols") if method == "cross" else ("rows",)
    ids = [irpe_bucket_ids(method, height, width, skip=skip, ratio=ratio, part=pt) for pt in parts]
    qkv = x @ params["qkv.weight"] + params.get("qkv.bias", 0.0)
    out = np.zeros((b, n, c))
    for bb in range(b):
        for h in range(num_heads):
            hp = 0 if shared_head else h
            q, k, v = (qkv[bb, :, i * c + h * d:i * c + (h + 1) * d] for i in range(3))
            e = np.zeros((n, n))
            for i in range(n):
                for j in range(n):
                    e[i, j] = s * q[i] @ k[j]
                    for t in _targets(rpe_on):
                        for name, idx in zip(_table_names(method, t, mode), ids):
                            if t == "k":
                                e[i, j] += params[name][hp, idx[i, j]] if mode == "bias" else \
                                    s * q[i] @ params[name][hp, :, idx[i, j]]
                            elif t == "q":
                                e[i, j] += params[name][hp, idx[j, i]] if mode == "bias" else \
                                    s * k[j] @ params[name][hp, :, idx[j, i]]
            a = np.exp(e - e.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            o = a @ v
            if "v" in rpe_on:
                for name, idx in zip(_table_names(method, "v", mode), ids):
                    o = o + np.einsum("ij,ijd->id", a, params[name][hp][idx])
            out[bb, :, h * d:(h + 1) * d] = o
    return out @ params["proj.weight"] + params["proj.bias"]


def _eq18_python(x, alpha, beta, gamma):
    # Eq. (18) one value at a time, float32 log branch like the upstream tensor arithmetic.
    if abs(x) <= alpha:
        return int(np.round(np.float32(x))) if isinstance(x, float) else int(x)
    a = np.float32(alpha)
    v = a + np.log(np.float32(abs(x)) / a) / np.float32(math.log(gamma / alpha)) * np.float32(beta - alpha)
    return int(math.copysign(min(float(np.round(v)), float(np.float32(beta))), x))


def _check_buckets_match_reference(rng):
    # The vectorised piecewise index and 2-D bucket maps equal per-pair transcriptions of get_bucket_ids_2d.
    for ratio in (1.9, 1.0, 2.5, 0.5):
        al, be, ga = irpe_coefficients(ratio)
        xs = np.arange(-40, 41)
        assert np.array_equal(irpe_piecewise_index(xs, al, be, ga), [_eq18_python(int(v), al, be, ga) for v in xs])
        fl = np.round(np.sqrt(np.arange(0, 900, 7).astype(np.float32)))
        assert np.array_equal(irpe_piecewise_index(fl, al, be, ga), [_eq18_python(float(v), al, be, ga) for v in fl])
    hh, ww, b_ = 3, 4, int(irpe_coefficients(1.9)[1])
    al, be, ga = irpe_coefficients(1.9)
    pos = [(i // ww, i % ww) for i in range(hh * ww)]
    for method in IRPE_METHODS:
        got = irpe_bucket_ids(method, hh, ww, skip=1)
        for i, (ri, ci) in enumerate(pos):
            for j, (rj, cj) in enumerate(pos):
                dr, dc = ri - rj, ci - cj
                if method == "product":
                    want = (_eq18_python(dr, al, be, ga) + b_) * (2 * b_ + 1) + _eq18_python(dc, al, be, ga) + b_
                elif method == "euc":
                    want = _eq18_python(float(np.round(np.sqrt(np.float32(dr * dr + dc * dc)))), al, be, ga) + b_
                elif method == "quant":
                    want = _eq18_python(dr * dr + dc * dc, al, be, ga) + b_
                else:
                    want = _eq18_python(dr, al, be, ga) + b_
                assert got[1 + i, 1 + j] == want, (method, i, j, got[1 + i, 1 + j], want)
        nb = irpe_num_buckets(method, be)
        assert np.all(got[0] == nb) and np.all(got[:, 0] == nb) and got[1:, 1:].max() < nb, method
    return 0.0


def _check_contextual_key_term(rng):
    # Contextual mode on keys with every table row equal to one vector r: the bias is s q_i.r, constant
    # along each row of the scores, so the output equals plain DeiT attention.
    from .sdpa import sdpa
    s = _sample(rng, "small", method="product", mode="contextual", rpe_on="k")
    p = dict(s.params)
    name = "rpe_k.lookup_table_weight"
    p[name] = np.broadcast_to(rng.standard_normal(p[name].shape[:2] + (1,)), p[name].shape).copy()
    x = s.inputs["x"]
    c, nh = x.shape[-1], s.config["num_heads"]
    qkv = x @ p["qkv.weight"] + p.get("qkv.bias", 0.0)
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))
    want = merge_heads(sdpa(q, k, v)) @ p["proj.weight"] + p["proj.bias"]
    err = float(np.abs(irpe_attention(x, p, **s.config) - want).max())
    assert err < 1e-12, f"a constant contextual table changed the attention (err {err:.2e})"
    return err


register(
    Mechanism(
        slug="irpe_image_relative_position", family="1-softmax", tier="T2",
        title="iRPE: image relative position encodings",
        paper="Wu, Peng, Chen, Fu, Chao, Rethinking and Improving Relative Position Encoding for Vision Transformer, "
              "ICCV 2021, arXiv 2107.14222",
        forward=irpe_attention_forward, backward=irpe_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/vision-attention.md#irpe-image-relative-position",
        checks={"buckets_match_reference": _check_buckets_match_reference,
                "contextual_key_term": _check_contextual_key_term},
    ),
)
