r"""Relative position embeddings with query *and* key interaction (method 4 of Huang et al.); BERT's
``position_embedding_type="relative_key_query"`` self-attention.

Paper: Huang, Liang, Xu, Xiang, "Improve Transformer Models with Better Relative Position
Embeddings", Findings of EMNLP 2020, arXiv 2009.13658. Upstream: Hugging Face transformers
``models/bert/modeling_bert.py`` (``BertSelfAttention``; v4.46.3 — transformers 5 removed the
``relative_key`` / ``relative_key_query`` branches).

Forward
-------
$x$ ``(B, N, C)``; $q, k, v$ from the ``query``/``key``/``value`` linear layers, split into $H$ heads
of width $d$. A single table $T$ ``(2P - 1, d)`` (``distance_embedding.weight``, shared by the heads;
$P$ = ``max_position_embeddings``) embeds the distance $i - j$ (query minus key):
$a_{ij} = T[\,i - j + P - 1\,]$. Then

$$e_{ij} = \frac{q_i\cdot k_j + q_i\cdot a_{ij} + k_j\cdot a_{ij}}{\sqrt d}
         = \frac{(q_i + a_{ij})\cdot(k_j + a_{ij}) - a_{ij}\cdot a_{ij}}{\sqrt d},$$

$P = \mathrm{softmax}(e + M)$ with the additive/boolean ``attn_mask`` $M$, output $O = PV$ with
heads merged (the "context layer"; BERT's output dense + LayerNorm live in ``BertSelfOutput``).
``position_embedding_type="relative_key"`` keeps only the $q_i\cdot a_{ij}$ term (method 3, Shaw-like).

Computation without an $N\times N\times d$ tensor: only the $L \le 2N-1$ table rows
$T_{\text{lo}:\text{hi}}$ that the distances reach are used; $qa = q\,T_{\text{lo}:\text{hi}}^\top$
and $ka = k\,T_{\text{lo}:\text{hi}}^\top$ (``(N, L)`` per head) are gathered at
$c_{ij} = \iota(i-j) - \text{lo}$: $B_{ij} = (qa_{i,c_{ij}} + ka_{j,c_{ij}})/\sqrt d$, an additive
score bias of the attention core (`refattn.attention.softmax.attention_core_forward`).

Backward (derivation)
---------------------
The attention VJP gives $dS$ and the bias gradient $dB = dS$. Then
$d(qa)_{ic} = \frac{1}{\sqrt d}\sum_{j: c_{ij} = c} dS_{ij}$, $d(ka)_{jc} = \frac{1}{\sqrt d}\sum_{i: c_{ij}=c} dS_{ij}$
(scatter-adds), so

$$dq_i \mathrel{+}= \sum_j \tfrac{dS_{ij}}{\sqrt d}\,a_{ij},\quad dk_j \mathrel{+}= \sum_i\tfrac{dS_{ij}}{\sqrt d}\,a_{ij},\quad
dT[\iota] = \sum_{(i,j):\,\iota(i-j)=\iota}\tfrac{dS_{ij}}{\sqrt d}(q_i + k_j)$$

(summed over batch and heads), computed as $d(qa)\,T$, $d(ka)\,T$ and $d(qa)^\top q + d(ka)^\top k$.
Together with the plain attention terms this is the catalogue's
$\partial q_i = \sum_j dS_{ij}(k_j + a_{ij})/\sqrt d$, $\partial k_j = \sum_i dS_{ij}(q_i + a_{ij})/\sqrt d$.
Then the linear VJPs.

Conventions
-----------
Distances are **not clipped** upstream: $N > P$ indexes past the table (an ``IndexError`` in
PyTorch); refattn raises ``ValueError`` there, and ``clip_distance=True`` clips $i - j$ to
$[-(P-1), P-1]$ (Shaw/Huang's clipping at $K = P - 1$). Upstream's KV-cache branch (one new query at
position ``key_length - 1``) and cross-attention are not modelled (self-attention only).
``scale`` defaults to $d^{-1/2}$ and multiplies all three terms; ``is_causal`` for decoder use.
Parameters as the upstream ``state_dict`` (weights ``(in, out)`` = torch ``weight.T``).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "RPE_KEY_QUERY_TYPES",
    "relative_distance_index",
    "gather_rows_at",
    "scatter_rows_at",
    "rpe_key_query_param_spec",
    "init_rpe_key_query_params",
    "rpe_key_query_forward",
    "rpe_key_query_backward",
    "rpe_key_query",
]

RPE_KEY_QUERY_TYPES = ("relative_key_query", "relative_key")
_LAYERS = ("query", "key", "value")


def relative_distance_index(n: int, m: int, max_position_embeddings: int, clip_distance: bool = False) -> np.ndarray:
    r"""``(N, M)`` rows $\iota(i - j) = \mathrm{clip}(i - j) + P - 1$ of ``distance_embedding`` (HF ``distance``)."""
    p = max_position_embeddings
    r = np.arange(n)[:, None] - np.arange(m)[None, :]
    if clip_distance:
        r = np.clip(r, -(p - 1), p - 1)
    return r + p - 1


def gather_rows_at(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``out[..., i, j] = a[..., rows[i, j], cols[i, j]]`` for ``a (..., R, L)`` and integer maps ``(N, M)``."""
    return a[..., rows, cols]


def scatter_rows_at(d: np.ndarray, rows: np.ndarray, cols: np.ndarray, shape: tuple) -> np.ndarray:
    """Adjoint of :func:`gather_rows_at`: ``out (..., R, L)`` with ``out[..., rows[i,j], cols[i,j]] += d[..., i, j]``."""
    lead = d.shape[:-2]
    nr, nl = shape
    d2 = d.reshape((-1,) + d.shape[-2:])
    flat = (np.arange(d2.shape[0])[:, None, None] * (nr * nl) + rows * nl + cols).reshape(-1)
    out = np.bincount(flat, weights=d2.reshape(-1), minlength=d2.shape[0] * nr * nl)
    return out.reshape(lead + (nr, nl)).astype(d.dtype, copy=False)


def rpe_key_query_param_spec(hidden_size: int, num_attention_heads: int, max_position_embeddings: int):
    """``(spec, optional)``: ``BertSelfAttention`` names and shapes (weights ``(in, out)``; biases optional)."""
    c, h = check_size(hidden_size, "hidden_size"), check_size(num_attention_heads, "num_attention_heads")
    p = check_size(max_position_embeddings, "max_position_embeddings")
    if c % h:
        raise ValueError(f"hidden_size ({c}) must be divisible by num_attention_heads ({h})")
    spec = {}
    for name in _LAYERS:
        spec.update(linear_prefixed_spec(name, c, c))
    spec["distance_embedding.weight"] = (2 * p - 1, c // h)
    return spec, tuple(f"{n}.bias" for n in _LAYERS)


def init_rpe_key_query_params(rng, hidden_size: int, num_attention_heads: int, max_position_embeddings: int,
                              table_scale: float = 0.5) -> dict:
    """PyTorch-default linear layers and an $\\mathcal N(0, s^2)$ distance table."""
    spec, _ = rpe_key_query_param_spec(hidden_size, num_attention_heads, max_position_embeddings)
    p = {}
    for name in _LAYERS:
        p.update(init_linear_prefixed(rng, hidden_size, hidden_size, name))
    p["distance_embedding.weight"] = table_scale * rng.standard_normal(spec["distance_embedding.weight"])
    return p


def rpe_key_query_forward(x, params, *, num_attention_heads: int, max_position_embeddings: int,
                          position_embedding_type: str = "relative_key_query", clip_distance: bool = False,
                          attn_mask=None, is_causal: bool = False, scale=None):
    r"""``BertSelfAttention`` with ``relative_key_query`` (or ``relative_key``) distance embeddings.

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``query.weight (C, C)``, ``key.weight``, ``value.weight`` (torch ``weight.T``), optional
        ``*.bias (C,)``, and ``distance_embedding.weight (2P - 1, C / H)``.
    num_attention_heads : int
    max_position_embeddings : int
        $P$; distances $|i - j| \le P - 1$ unless ``clip_distance``.
    position_embedding_type : {"relative_key_query", "relative_key"}
    clip_distance : bool
        Clip $i - j$ to $\pm(P-1)$ instead of raising for $N > P$ (upstream raises).
    attn_mask : bool or additive float array broadcastable to (B, H, N, N), optional
        HF's extended mask is additive (``(1 - mask) * finfo.min``).
    is_causal : bool
    scale : float, optional
        Default $d^{-1/2}$.

    Returns
    -------
    out, cache
        The context layer ``(B, N, C)``.
    """
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    h = check_size(num_attention_heads, "num_attention_heads")
    pmax = check_size(max_position_embeddings, "max_position_embeddings")
    check_choice(position_embedding_type, "position_embedding_type", RPE_KEY_QUERY_TYPES)
    if not isinstance(clip_distance, (bool, np.bool_)):
        raise TypeError(f"clip_distance must be a bool; got {type(clip_distance).__name__}")
    if n > pmax and not clip_distance:
        raise ValueError(f"x has N={n} tokens but max_position_embeddings={pmax} covers distances up to {pmax - 1} "
                         f"(upstream indexes past the table); raise max_position_embeddings or pass clip_distance=True")
    scale = check_positive(scale, "scale", allow_none=True)
    spec, optional = rpe_key_query_param_spec(c, h, pmax)
    p = check_params(params, spec, optional=optional, where="rpe_key_query (BertSelfAttention; weights (in, out))")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    d = c // h
    s = float(d ** -0.5) if scale is None else scale
    q, k, v = (split_heads(linear_prefixed(p, name, x), h) for name in _LAYERS)
    idx = relative_distance_index(n, n, pmax, bool(clip_distance))
    lo, hi = int(idx.min()), int(idx.max())
    tab = p["distance_embedding.weight"][lo:hi + 1]
    cols = idx - lo
    rows_q, rows_k = np.broadcast_to(np.arange(n)[:, None], (n, n)), np.broadcast_to(np.arange(n)[None, :], (n, n))
    bias = gather_rows_at(q @ tab.T, rows_q, cols)
    if position_embedding_type == "relative_key_query":
        bias = bias + gather_rows_at(k @ tab.T, rows_k, cols)
    o, core = attention_core_forward(q, k, v, s * bias, attn_mask=attn_mask, is_causal=is_causal, scale=s)
    om = merge_heads(o)
    cache = {"x": x, "p": p, "q": q, "k": k, "core": core, "tab": tab, "lo": lo, "cols": cols, "rows_q": rows_q,
             "rows_k": rows_k, "s": s, "h": h, "kind": position_embedding_type}
    return om, cache


def rpe_key_query_backward(dout, cache):
    """Gradient of :func:`rpe_key_query_forward`: ``x`` and every parameter (derivation in the module docstring)."""
    p, x, q, k, tab, s, h = cache["p"], cache["x"], cache["q"], cache["k"], cache["tab"], cache["s"], cache["h"]
    g = as_dout(dout, x.shape, x.dtype)
    gc = attention_core_backward(split_heads(g, h), cache["core"])
    db = s * gc["bias"]
    nl = tab.shape[0]
    dqa = scatter_rows_at(db, cache["rows_q"], cache["cols"], (q.shape[-2], nl))
    dq = gc["q"] + dqa @ tab
    dtab = dqa.reshape(-1, nl).T @ q.reshape(-1, q.shape[-1])
    dk = gc["k"]
    if cache["kind"] == "relative_key_query":
        dka = scatter_rows_at(db, cache["rows_k"], cache["cols"], (k.shape[-2], nl))
        dk = dk + dka @ tab
        dtab = dtab + dka.reshape(-1, nl).T @ k.reshape(-1, k.shape[-1])
    grads = {"distance_embedding.weight": np.zeros_like(p["distance_embedding.weight"])}
    grads["distance_embedding.weight"][cache["lo"]:cache["lo"] + nl] = dtab
    dx = None
    for name, dh in zip(_LAYERS, (dq, dk, gc["v"])):
        dxi = linear_prefixed_vjp(grads, p, name, merge_heads(dh), x)
        dx = dxi if dx is None else dx + dxi
    return {"x": dx, **{key: grads[key] for key in p}}


def rpe_key_query(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`rpe_key_query_forward`."""
    return rpe_key_query_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, kind=None):
    if size == "tiny":
        n, c, h = int(rng.integers(2, 4)), 4, 2
    else:
        n, c, h = int(rng.integers(4, 8)), 6, int(rng.choice([2, 3]))
    clip = bool(rng.random() < 0.4)
    pmax = int(rng.integers(2, n + 1)) if clip else n + int(rng.integers(0, 3))
    p = init_rpe_key_query_params(rng, c, h, pmax)
    if rng.random() < 0.3:
        for name in _LAYERS:
            del p[f"{name}.bias"]
    cfg = {"num_attention_heads": h, "max_position_embeddings": pmax, "clip_distance": clip,
           "position_embedding_type": kind or str(rng.choice(RPE_KEY_QUERY_TYPES))}
    if rng.random() < 0.4:
        cfg["is_causal"] = True
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _reference(x, params, *, num_attention_heads, max_position_embeddings, position_embedding_type="relative_key_query",
               clip_distance=False, attn_mask=None, is_causal=False, scale=None):
    # Per (batch, head, i, j): the catalogue's e_ij = (q.k + q.a + k.a) / sqrt(d), a_ij = T[clip(i - j) + P - 1].
    b, n, c = x.shape
    h, pm = num_attention_heads, max_position_embeddings
    d = c // h
    s = d ** -0.5 if scale is None else scale
    lin = {name: x @ params[f"{name}.weight"] + params.get(f"{name}.bias", 0.0) for name in _LAYERS}
    tab = params["distance_embedding.weight"]
    out = np.zeros((b, n, c))
    for bb in range(b):
        for hh in range(h):
            q, k, v = (lin[name][bb, :, hh * d:(hh + 1) * d] for name in _LAYERS)
            e = np.empty((n, n))
            for i in range(n):
                for j in range(n):
                    r = i - j if not clip_distance else min(max(i - j, -(pm - 1)), pm - 1)
                    a = tab[r + pm - 1]
                    e[i, j] = q[i] @ k[j] + q[i] @ a + (k[j] @ a if position_embedding_type == "relative_key_query"
                                                         else 0.0)
            e = s * e
            if is_causal:
                e = np.where(np.tri(n, dtype=bool), e, -np.inf)
            w = np.exp(e - e.max(-1, keepdims=True))
            out[bb, :, hh * d:(hh + 1) * d] = (w / w.sum(-1, keepdims=True)) @ v
    return out


def _check_zero_table_is_sdpa(rng):
    # T = 0 reduces to plain (BERT) multi-head self-attention.
    from .sdpa import sdpa
    s = _sample(rng, "small", "relative_key_query")
    p = dict(s.params)
    p["distance_embedding.weight"] = np.zeros_like(p["distance_embedding.weight"])
    x, h = s.inputs["x"], s.config["num_attention_heads"]
    q, k, v = (split_heads(x @ p[f"{nm}.weight"] + p.get(f"{nm}.bias", 0.0), h) for nm in _LAYERS)
    want = merge_heads(sdpa(q, k, v, is_causal=s.config.get("is_causal", False)))
    err = float(np.abs(rpe_key_query(x, p, **s.config) - want).max())
    assert err < 1e-12, err
    return err


def _check_algebraic_forms_agree(rng):
    # q.k + q.a + k.a == (q + a).(k + a) - a.a, entry by entry, on the layer's own q, k and table.
    n, d, pm = 5, 3, 4
    q, k = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    tab = rng.standard_normal((2 * pm - 1, d))
    idx = relative_distance_index(n, n, pm, True)
    a = tab[idx]                                                        # (N, N, d): fine at this size
    lhs = q @ k.T + np.einsum("id,ijd->ij", q, a) + np.einsum("jd,ijd->ij", k, a)
    rhs = np.einsum("ijd,ijd->ij", q[:, None] + a, k[None] + a) - np.einsum("ijd,ijd->ij", a, a)
    cols = idx - idx.min()
    rows_q = np.broadcast_to(np.arange(n)[:, None], (n, n))
    rows_k = np.broadcast_to(np.arange(n)[None, :], (n, n))
    sub = tab[idx.min():idx.max() + 1]
    fast = q @ k.T + gather_rows_at(q @ sub.T, rows_q, cols) + gather_rows_at(k @ sub.T, rows_k, cols)
    err = max(float(np.abs(lhs - rhs).max()), float(np.abs(lhs - fast).max()))
    assert err < 1e-12, err
    return err


def _check_distance_index(rng):
    # HF's rows: distance = i - j (query minus key) + P - 1; unclipped they cover exactly [P - N, P + N - 2].
    idx = relative_distance_index(4, 4, 6)
    assert idx[0, 0] == 5 and idx[3, 0] == 8 and idx[0, 3] == 2 and idx.min() == 2 and idx.max() == 8
    cl = relative_distance_index(6, 6, 3, clip_distance=True)
    assert cl.min() == 0 and cl.max() == 4 and cl[5, 0] == 4 and cl[0, 5] == 0
    d = rng.standard_normal((2, 3, 6, 6))
    cols = cl - cl.min()
    rows = np.broadcast_to(np.arange(6)[:, None], (6, 6))
    a = rng.standard_normal((2, 3, 6, 5))
    # <gather(a), d> == <a, scatter(d)>: the scatter is the adjoint of the gather
    err = abs(float(np.sum(gather_rows_at(a, rows, cols) * d) - np.sum(a * scatter_rows_at(d, rows, cols, (6, 5)))))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="rpe_key_query_huang", family="1-softmax", tier="T2",
        title="Relative position embedding with query-key interaction (Huang et al., method 4)",
        paper="Huang, Liang, Xu, Xiang, Improve Transformer Models with Better Relative Position Embeddings, "
              "Findings of EMNLP 2020, arXiv 2009.13658",
        forward=rpe_key_query_forward, backward=rpe_key_query_backward, sample=_sample, reference=_reference,
        docs="softmax/positional-encodings.md#relative-key-query-position-embeddings-huang-et-al",
        checks={"zero_table_is_sdpa": _check_zero_table_is_sdpa,
                "algebraic_forms_agree": _check_algebraic_forms_agree, "distance_index": _check_distance_index},
    ),
)
