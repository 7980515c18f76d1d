r"""URPE: universal RPE-based attention — softmax attention with a relative bias, Hadamard-modulated by a
learnable Toeplitz matrix.

Paper: Luo, Li, Zheng, Liu, Wang, He, "Your Transformer May Not be as Powerful as You Expect",
NeurIPS 2022, arXiv 2205.13401. Upstream: lsj2408/URPE @47b711f85be5de010deeafa9d8788d399912c3a2,
``fairseq/modules/multihead_attention.py`` (``MultiheadAttention.forward``: ``rel_pos_bias`` added
before the softmax, ``ur_rel_pos_bias`` multiplied after it) and
``fairseq/modules/transformer_sentence_encoder.py`` (``relative_position_bucket`` and the tables
``rp_bias`` / ``ur_rp_bias`` built in ``TransformerSentenceEncoder.__init__``/``forward``).

Forward
-------
$x$ ``(B, N, C)``, $q = (xW_q + b_q)\,d^{-1/2}$, $k = xW_k + b_k$, $v = xW_v + b_v$ (fairseq
scales $q$ after its bias), per head $h$

$$P = \mathrm{softmax}\big(qk^\top + B_h\big),\qquad O_h = \big(P\odot C_h\big)\,v,\qquad y = [O_1\|\dots\|O_H]W_o + b_o,$$

$B_{h,ij} = \beta[\iota_B(i,j), h]$ (``rp_bias.weight``) and $C_{h,ij} = \gamma[\iota_C(i,j), h]$
(``ur_rp_bias.weight``): both Toeplitz, read through a bucket of the relative position
$j - i$. **No renormalisation** after the Hadamard product, as upstream: the rows of $P\odot C$ need
not sum to one — that is the point of the paper (an RPE inside a row-stochastic softmax cannot
make the Transformer universal; the elementwise $C$ lifts the constraint).

Buckets (upstream ``relative_position_bucket`` then the encoder's shift), for $r = j - i$:
half the buckets per sign, $m_e = \lfloor nb/4\rfloor$ exact distances, log-spaced up to
``max_distance`` (float32 logarithm, as upstream), signed; then non-negative buckets are shifted by
$+2$ and everything by minus the minimum **over the** ``max_seq_len``$\times$``max_seq_len``
**matrix** (so the rows used depend on ``max_seq_len`` when ``max_seq_len - 1`` is below
``max_distance``); the table has ``num_buckets + 1`` rows. ``*_unique=True`` gives one row per
distance: $\iota = j - i + L - 1$, $2L - 1$ rows ($L$ = ``max_seq_len``). The matrices are built
for $L$ and cut to the first $N$ rows and columns.

Backward (derivation)
---------------------
$\tilde P = P\odot C$, $O = \tilde P v$: $d\tilde P = dO\,v^\top$, $dv = \tilde P^\top dO$,
$dC = d\tilde P\odot P$ scattered onto the table, $d\gamma[t, h] = \sum_{b}\sum_{\iota_C(i,j)=t} dC_{b,h,ij}$
(the diagonal sums of the Toeplitz gradient); $dP = d\tilde P\odot C$ goes through the softmax VJP
(`refattn.attention.softmax.attention_core_backward` with ``dp``) to $dS$, which gives $dq, dk$ and
$d\beta[t,h] = \sum_{b}\sum_{\iota_B(i,j)=t}dS_{b,h,ij}$ (`refattn.attention.softmax.scatter_bias_grad`);
then the linear VJPs ($q$'s includes the $d^{-1/2}$).

Conventions
-----------
``key_padding_mask`` ``(B, N)`` bool, True = padding (fairseq): padded keys get $-\infty$ in the
scores and $0$ in $C$, as upstream. The tables live on the encoder upstream (``sentence_encoder.rp_bias``,
shared by all layers) and here are the layer's parameters. ``rel_pos`` / ``ur_attn`` switch $B$ / $C$
(both on: URPE; ``ur_attn=False``: the RPE baseline). Upstream's ``constant_init_ur_attn`` starts $C$ at
all ones (`init_urpe_params` ``constant_ur=True``). Weights ``(in, out)`` = torch ``weight.T``.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_params,
    check_positive,
    compute_dtype,
)
from ...nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ...registry import Mechanism, Sample, register
from .additive_bias import gather_bias, scatter_bias_grad
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "urpe_relative_bucket",
    "urpe_bucket_ids",
    "urpe_num_rows",
    "urpe_param_spec",
    "init_urpe_params",
    "urpe_attention_forward",
    "urpe_attention_backward",
    "urpe_attention",
]

_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def urpe_relative_bucket(relative_position, num_buckets: int = 64, max_distance: int = 128) -> np.ndarray:
    """Upstream's signed ``relative_position_bucket`` (int64, same shape; float32 log branch)."""
    rp = np.asarray(relative_position).astype(np.int64)
    sign = np.sign(rp)
    half = num_buckets // 2
    n = np.abs(rp)
    max_exact = half // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(f"need num_buckets >= 4 and max_distance > num_buckets // 4; got num_buckets={num_buckets}, "
                         f"max_distance={max_distance}")
    ratio = np.maximum(n, 1).astype(np.float32) / np.float32(max_exact)   # n >= 1 inside the log (read only if large)
    large = max_exact + (np.log(ratio) / np.float32(math.log(max_distance / max_exact))
                         * np.float32(half - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return np.where(n < max_exact, n, large) * sign


def urpe_num_rows(max_seq_len: int, num_buckets: int, unique: bool) -> int:
    """Table rows: ``num_buckets + 1`` (bucketed) or ``2 * max_seq_len - 1`` (one per distance)."""
    return 2 * max_seq_len - 1 if unique else num_buckets + 1


def urpe_bucket_ids(seq_len: int, *, max_seq_len: int = 512, num_buckets: int = 64, max_distance: int = 128,
                    unique: bool = False) -> np.ndarray:
    """``(N, N)`` table rows of the encoder's ``bucket`` / ``ur_bucket`` matrices (built for ``max_seq_len``, cut to N)."""
    n = check_size(seq_len, "seq_len")
    big = check_size(max_seq_len, "max_seq_len")
    if n > big:
        raise ValueError(f"sequence length N={n} exceeds max_seq_len={big}")
    rel = np.arange(big)[None, :] - np.arange(big)[:, None]              # memory - context = j - i
    if unique:
        ids = rel - rel.min()
    else:
        ids = urpe_relative_bucket(rel, num_buckets, max_distance)
        ids = np.where(ids >= 0, ids + 2, ids)
        ids = ids - ids.min()
    return np.ascontiguousarray(ids[:n, :n])


def urpe_param_spec(embed_dim: int, num_heads: int, *, max_seq_len: int = 512, rel_pos: bool = True,
                    rel_pos_unique: bool = False, rp_bucket: int = 64, ur_attn: bool = True, ur_attn_unique: bool = False,
                    ur_rp_bucket: int = 64):
    """``(spec, optional)``: the projections (fairseq names, weights ``(in, out)``) and the two tables."""
    c, h = check_size(embed_dim, "embed_dim"), check_size(num_heads, "num_heads")
    if c % h:
        raise ValueError(f"embed_dim ({c}) must be divisible by num_heads ({h})")
    spec = {}
    for name in _PROJ:
        spec.update(linear_prefixed_spec(name, c, c))
    if rel_pos:
        spec["rp_bias.weight"] = (urpe_num_rows(max_seq_len, rp_bucket, rel_pos_unique), h)
    if ur_attn:
        spec["ur_rp_bias.weight"] = (urpe_num_rows(max_seq_len, ur_rp_bucket, ur_attn_unique), h)
    return spec, tuple(f"{n}.bias" for n in _PROJ)


def init_urpe_params(rng, embed_dim: int, num_heads: int, *, constant_ur: bool = False, **config) -> dict:
    """PyTorch-default projections, $\\mathcal N(0, 1/4)$ bias table, $C$ table $1 + \\mathcal N(0, 1/4)$
    (or all ones with ``constant_ur``, upstream's ``constant_init_ur_attn``)."""
    spec, _ = urpe_param_spec(embed_dim, num_heads, **config)
    p = {}
    for name in _PROJ:
        p.update(init_linear_prefixed(rng, embed_dim, embed_dim, name))
    if "rp_bias.weight" in spec:
        p["rp_bias.weight"] = 0.5 * rng.standard_normal(spec["rp_bias.weight"])
    if "ur_rp_bias.weight" in spec:
        shp = spec["ur_rp_bias.weight"]
        p["ur_rp_bias.weight"] = np.ones(shp) if constant_ur else 1.0 + 0.5 * rng.standard_normal(shp)
    return p


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return bool(value)


def urpe_attention_forward(x, params, *, num_heads: int, max_seq_len: int = 512, rel_pos: bool = True,
                           rel_pos_unique: bool = False, rp_bucket: int = 64, max_rp: int = 128, ur_attn: bool = True,
                           ur_attn_unique: bool = False, ur_rp_bucket: int = 64, ur_max_rp: int = 128,
                           key_padding_mask=None, scale=None):
    r"""URPE self-attention layer (fairseq ``MultiheadAttention`` with ``rel_pos_bias`` and ``ur_rel_pos_bias``).

    Parameters
    ----------
    x : array (B, N, C)
        Token-major (fairseq is time-major ``(N, B, C)``: transpose).
    params : dict
        ``q_proj/k_proj/v_proj/out_proj.weight (C, C)`` (torch ``weight.T``), optional ``*.bias``;
        ``rp_bias.weight (rows, H)`` when ``rel_pos``; ``ur_rp_bias.weight (rows, H)`` when ``ur_attn``.
    num_heads : int
    max_seq_len : int
        The length the bucket matrices are built for (upstream ``max_seq_len = max_positions``).
    rel_pos, rel_pos_unique, rp_bucket, max_rp
        The additive bias $B$: on/off, one row per distance, number of buckets, log range.
    ur_attn, ur_attn_unique, ur_rp_bucket, ur_max_rp
        The multiplicative Toeplitz matrix $C$, likewise.
    key_padding_mask : bool array (B, N), optional
        True = padding token (excluded as a key; $C$ zeroed there).
    scale : float, optional
        Default $d^{-1/2}$.

    Returns
    -------
    y, cache
        ``y (B, N, C)``.
    """
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    h = check_size(num_heads, "num_heads")
    big = check_size(max_seq_len, "max_seq_len")
    if n > big:
        raise ValueError(f"x has N={n} tokens, more than max_seq_len={big}")
    flags = {nm: _flag(val, nm) for nm, val in (("rel_pos", rel_pos), ("rel_pos_unique", rel_pos_unique),
                                               ("ur_attn", ur_attn), ("ur_attn_unique", ur_attn_unique))}
    rp_bucket, ur_rp_bucket = check_size(rp_bucket, "rp_bucket", 4), check_size(ur_rp_bucket, "ur_rp_bucket", 4)
    max_rp, ur_max_rp = check_size(max_rp, "max_rp"), check_size(ur_max_rp, "ur_max_rp")
    scale = check_positive(scale, "scale", allow_none=True)
    keep = None
    if key_padding_mask is not None:
        kpm = np.asarray(key_padding_mask)
        if kpm.dtype != np.bool_:
            raise TypeError(f"key_padding_mask must be a boolean array (True = padding); got dtype {kpm.dtype}")
        if kpm.shape != (b, n):
            raise ValueError(f"key_padding_mask must have shape (B, N) = ({b}, {n}); got {kpm.shape}")
        keep = ~kpm[:, None, None, :]
    spec, optional = urpe_param_spec(c, h, max_seq_len=big, rp_bucket=rp_bucket, ur_rp_bucket=ur_rp_bucket, **flags)
    p = check_params(params, spec, optional=optional, where="urpe_attention (fairseq names; weights (in, out))")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    d = c // h
    s = float(d ** -0.5) if scale is None else scale
    q, k, v = (split_heads(linear_prefixed(p, name, x), h) for name in _PROJ[:3])
    ids_b = ids_c = None
    bias = None
    if flags["rel_pos"]:
        ids_b = urpe_bucket_ids(n, max_seq_len=big, num_buckets=rp_bucket, max_distance=max_rp,
                                unique=flags["rel_pos_unique"])
        bias = gather_bias(p["rp_bias.weight"], ids_b)
    _, core = attention_core_forward(q, k, v, bias, attn_mask=keep, scale=s)
    pm = core["p"]
    cm = None
    if flags["ur_attn"]:
        ids_c = urpe_bucket_ids(n, max_seq_len=big, num_buckets=ur_rp_bucket, max_distance=ur_max_rp,
                                unique=flags["ur_attn_unique"])
        cm = gather_bias(p["ur_rp_bias.weight"], ids_c)                     # (H, N, N)
        if keep is not None:
            cm = cm * keep
    pt = pm if cm is None else pm * cm
    om = merge_heads(pt @ v)
    y = linear_prefixed(p, "out_proj", om)
    cache = {"x": x, "p": p, "core": core, "v": v, "cm": cm, "pt": pt, "om": om, "ids_b": ids_b, "ids_c": ids_c,
             "h": h, "shape": y.shape}
    return y, cache


def urpe_attention_backward(dout, cache):
    """Gradient of :func:`urpe_attention_forward`: ``x`` and every parameter (derivation in the module docstring)."""
    p, x, h, v, cm, pt, core = cache["p"], cache["x"], cache["h"], cache["v"], cache["cm"], cache["pt"], cache["core"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    do = split_heads(linear_prefixed_vjp(grads, p, "out_proj", g, cache["om"]), h)
    dpt = do @ np.swapaxes(v, -1, -2)
    dv = np.swapaxes(pt, -1, -2) @ do
    dp = dpt
    if cm is not None:
        pw = p["ur_rp_bias.weight"]
        grads["ur_rp_bias.weight"] = scatter_bias_grad(dpt * core["p"], cache["ids_c"], pw.shape[0])
        dp = dpt * cm
    gc = attention_core_backward(np.zeros_like(do), core, dp=dp)
    if cache["ids_b"] is not None:
        grads["rp_bias.weight"] = scatter_bias_grad(gc["bias"], cache["ids_b"], p["rp_bias.weight"].shape[0])
    dx = None
    for name, dh in zip(_PROJ[:3], (gc["q"], gc["k"], dv)):
        dxi = linear_prefixed_vjp(grads, p, name, merge_heads(dh), x)
        dx = dxi if dx is None else dx + dxi
    return {"x": dx, **{key: grads[key] for key in p}}


def urpe_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`urpe_attention_forward`."""
    return urpe_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, h, big = int(rng.integers(2, 4)), 4, 2, int(rng.integers(3, 6))
    else:
        n, c, h, big = int(rng.integers(4, 8)), 6, int(rng.choice([2, 3])), int(rng.integers(8, 40))
    cfg = {"num_heads": h, "max_seq_len": big, "rp_bucket": 8, "max_rp": 16, "ur_rp_bucket": 8, "ur_max_rp": 16,
           "rel_pos_unique": bool(rng.random() < 0.3), "ur_attn_unique": bool(rng.random() < 0.3)}
    if size == "small" and rng.random() < 0.3:
        cfg["rel_pos"] = False
    p = init_urpe_params(rng, c, h, max_seq_len=big, rp_bucket=8, ur_rp_bucket=8,
                         rel_pos=cfg.get("rel_pos", True), rel_pos_unique=cfg["rel_pos_unique"],
                         ur_attn_unique=cfg["ur_attn_unique"])
    if size == "small" and rng.random() < 0.5:
        kpm = np.zeros((2, n), bool)
        kpm[1, -1] = True
        cfg["key_padding_mask"] = kpm
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _reference(x, params, *, num_heads, max_seq_len=512, rel_pos=True, rel_pos_unique=False, rp_bucket=64, max_rp=128,
               ur_attn=True, ur_attn_unique=False, ur_rp_bucket=64, ur_max_rp=128, key_padding_mask=None, scale=None):
    # Per (batch, head, i, j): the bucket of j - i read from a per-entry transcription, then the loop formula.
    b, n, c = x.shape
    h = num_heads
    d = c // h
    s = d ** -0.5 if scale is None else scale

    def row(r, nb, md, unique):
        if unique:
            return r + max_seq_len - 1
        # the smallest entry of the shifted max_seq_len x max_seq_len matrix
        lo = -int(urpe_relative_bucket(np.array(max_seq_len - 1), nb, md)) if max_seq_len > 1 else 2
        bk = int(urpe_relative_bucket(np.array(r), nb, md))
        return (bk + 2 if bk >= 0 else bk) - lo

    lin = {name: x @ params[f"{name}.weight"] + params.get(f"{name}.bias", 0.0) for name in _PROJ[:3]}
    out = np.zeros((b, n, c))
    for bb in range(b):
        for hh in range(h):
            q, k, v = (lin[name][bb, :, hh * d:(hh + 1) * d] for name in _PROJ[:3])
            e, cc = np.empty((n, n)), np.ones((n, n))
            for i in range(n):
                for j in range(n):
                    e[i, j] = s * q[i] @ k[j]
                    if rel_pos:
                        e[i, j] += params["rp_bias.weight"][row(j - i, rp_bucket, max_rp, rel_pos_unique), hh]
                    if ur_attn:
                        cc[i, j] = params["ur_rp_bias.weight"][row(j - i, ur_rp_bucket, ur_max_rp, ur_attn_unique), hh]
                    if key_padding_mask is not None and key_padding_mask[bb, j]:
                        e[i, j], cc[i, j] = -np.inf, 0.0
            w = np.exp(e - e.max(-1, keepdims=True))
            out[bb, :, hh * d:(hh + 1) * d] = (w / w.sum(-1, keepdims=True) * cc) @ v
    return out @ params["out_proj.weight"] + params.get("out_proj.bias", 0.0)


def _bucket_python(r, num_buckets, max_distance):
    # upstream's relative_position_bucket, one integer at a time (float32 log as the torch code)
    sign = (r > 0) - (r < 0)
    half = num_buckets // 2
    n = abs(r)
    max_exact = half // 2
    if n < max_exact:
        return n * sign
    v = max_exact + int(np.log(np.float32(n) / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
                        * np.float32(half - max_exact))
    return min(v, half - 1) * sign


def _check_buckets_match_reference(rng):
    r = np.arange(-600, 601)
    for nb, md in ((64, 128), (8, 16), (32, 256)):
        got = urpe_relative_bucket(r, nb, md)
        assert np.array_equal(got, [_bucket_python(int(x), nb, md) for x in r]), (nb, md)
    # the shifted index matrix: rows in [0, num_buckets], non-negative distances jump by 2, Toeplitz
    for big in (8, 200):
        ids = urpe_bucket_ids(big, max_seq_len=big, num_buckets=64, max_distance=128)
        assert ids.min() == 0 and ids.max() <= 64
        assert all(np.unique(np.diagonal(ids, o)).size == 1 for o in range(-big + 1, big))
        assert ids[0, 0] - ids[1, 0] == 3          # bucket(0) + 2 vs bucket(-1)
    u = urpe_bucket_ids(5, max_seq_len=9, unique=True)
    assert u[0, 0] == 8 and u[0, 4] == 12 and u[4, 0] == 4
    return 0.0


def _check_constant_c_is_biased_sdpa(rng):
    # C == 1 everywhere: the layer is softmax attention with the relative bias B (an RPE-based Transformer).
    cfg = {"num_heads": 2, "max_seq_len": 10, "rp_bucket": 8, "max_rp": 16, "ur_rp_bucket": 8, "ur_max_rp": 16}
    p = init_urpe_params(rng, 6, 2, constant_ur=True, max_seq_len=10, rp_bucket=8, ur_rp_bucket=8)
    x = rng.standard_normal((2, 6, 6))
    q, k, v = (split_heads(x @ p[f"{nm}.weight"] + p[f"{nm}.bias"], 2) for nm in _PROJ[:3])
    bias = gather_bias(p["rp_bias.weight"], urpe_bucket_ids(6, max_seq_len=10, num_buckets=8, max_distance=16))
    want = merge_heads(_biased(q, k, v, bias)) @ p["out_proj.weight"] + p["out_proj.bias"]
    err = float(np.abs(urpe_attention(x, p, **cfg) - want).max())
    assert err < 1e-12, err
    # and with C scaled by a constant factor the attention output scales by it (no renormalisation)
    p2 = dict(p)
    p2["ur_rp_bias.weight"] = 2.5 * p["ur_rp_bias.weight"]
    y1 = urpe_attention(x, p, **cfg) - p["out_proj.bias"]
    y2 = urpe_attention(x, p2, **cfg) - p["out_proj.bias"]
    err2 = float(np.abs(y2 - 2.5 * y1).max())
    assert err2 < 1e-12, err2
    return max(err, err2)


def _biased(q, k, v, bias):
    e = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    w = np.exp(e - e.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


register(
    Mechanism(
        slug="urpe_toeplitz_modulated_attention", family="1-softmax", tier="T2",
        title="URPE: universal RPE attention (Toeplitz-modulated softmax)",
        paper="Luo, Li, Zheng, Liu, Wang, He, Your Transformer May Not be as Powerful as You Expect, NeurIPS 2022, "
              "arXiv 2205.13401",
        forward=urpe_attention_forward, backward=urpe_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/positional-encodings.md#urpe-toeplitz-modulated-attention",
        checks={"buckets_match_reference": _check_buckets_match_reference,
                "constant_c_is_biased_sdpa": _check_constant_c_is_biased_sdpa},
    ),
)
