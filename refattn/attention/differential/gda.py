r"""Grouped Differential Attention (GDA): unbalanced signal / noise-control head groups.

Lim et al. (Motif Technologies), "Grouped Differential Attention", 2025, arXiv 2510.06949;
followed code: Motif Technologies' vLLM fork ``vllm/model_executor/models/motif.py`` (commit
477e4d7) and ``vllm-project/vllm`` ``vllm/v1/attention/backends/grouped_diff_attn.py`` (commit
49902a1). $H_s$ signal heads share $H_n = H_s/r$ noise heads ($r$ = ``noise_group_ratio``, "akin
to GQA"):

$$\mathrm{head}_i = (1-\lambda_{init})\,\mathrm{RMSNorm}_{2d}\bigl(\mathrm{softmax}(sQ_1^iK_1^{j(i)\top}+M)V^{j(i)}
  - \lambda\,\mathrm{softmax}(sQ_2^{g(i)}K_2^{j(i)\top}+M)V^{j(i)}\bigr),\qquad Y = [\mathrm{head}_i]_iW_o,$$

$g(i) = \lfloor i/r\rfloor$, $j(i)$ the key/value group. It is the V1 layer
(``refattn.attention.differential.layer``) with the index maps `gda_head_index` /
`gda_kv_index`; ``noise_group_ratio=1`` is V1 exactly. Backward: V1's chain; the adjoint of the
repetition sums the gradient of each noise half-head (and of each shared key/value group) over
the signal heads that use it. Sources, reconstructions and layouts are detailed in
`grouped_differential_attention_forward`.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_float, check_choice, check_int, check_weight_in
from ...registry import Mechanism, Sample, register
from ._samples import draw_lambda_vectors
from .layer import (
    V1_LAMBDA_KEYS,
    lambda_init_fn,
    resolve_lambda_init,
    rope_tables,
    v1_generic_backward,
    v1_generic_forward,
)
from .v1 import diff_attention_v1_backward, diff_attention_v1_forward

__all__ = [
    "gda_head_index",
    "gda_kv_index",
    "grouped_differential_attention_forward",
    "grouped_differential_attention_backward",
    "grouped_differential_attention",
]


def gda_head_index(num_signal_heads: int, noise_group_ratio: int, head_layout: str = "grouped"):
    r"""Query half-head indices of GDA: for signal head $i$, its own query half-head and the shared
    noise half-head of group $g(i) = \lfloor i/r\rfloor$.

    ``"grouped"``: blocks of $r$ signal half-heads followed by their noise half-head,
    ``[s_0 .. s_{r-1}, n_0, s_r .. s_{2r-1}, n_1, ...]`` — the layout of the Motif-2-12.7B code
    (vLLM ``GroupedDifferentialAttentionImpl.split_q_heads``: "``[Q1, ..., Q1, Q2]``" per group,
    ``rearrange(q, "... (num_groups group_size) D -> ...")``); for $r = 1$ exactly V1's adjacent pairing.
    ``"split"``: all signal half-heads, then all noise half-heads — for $r = 1$ V1's ``"halves"``.
    Returns ``(signal_idx, noise_idx)`` of length $H_s$.
    """
    i = np.arange(num_signal_heads)
    g = i // noise_group_ratio
    if head_layout == "grouped":
        return g * (noise_group_ratio + 1) + i % noise_group_ratio, g * (noise_group_ratio + 1) + noise_group_ratio
    return i, num_signal_heads + g


def gda_kv_index(num_signal_heads: int, num_kv_heads: int, head_layout: str = "grouped"):
    r"""Key/value indices of GDA's grouped key/value layout (``kv_layout="gqa"``).

    $G$ = ``num_kv_heads`` key/value groups, each with one $K_1$ half-head, one $K_2$ half-head
    (width $d$) and one value head; signal head $i$ (and its noise head $g(i)$) use group
    $j = \lfloor i/(H_s/G)\rfloor$. ``k_proj`` holds $2G$ half-heads: ``"grouped"`` interleaves them
    ``[k1_0, k2_0, k1_1, k2_1, ...]`` (vLLM ``split_heads``: ``rearrange(x, "... (H two) D -> ... H two D")``),
    ``"split"`` stores ``[k1_0 .. k1_{G-1}, k2_0 .. k2_{G-1}]``. Returns ``(k1_idx, k2_idx, v_idx)``
    of length $H_s$.
    """
    j = np.arange(num_signal_heads) // (num_signal_heads // num_kv_heads)
    if head_layout == "grouped":
        return 2 * j, 2 * j + 1, j
    return j, num_kv_heads + j, j


def grouped_differential_attention_forward(x, params, *, num_signal_heads: int, noise_group_ratio: int = 1,
                                           head_layout: str = "grouped", kv_layout: str = "gqa",
                                           num_kv_heads: int | None = None, depth: int | None = None,
                                           lambda_init: float | None = None,
                                           lambda_init_convention: str = "motif", attn_mask=None,
                                           is_causal: bool | None = None,
                                           causal_alignment: str = "bottom_right", rel_pos=None,
                                           rope_interleaved: bool = False, scale=None, subln: str = "rms",
                                           subln_affine: bool = True, subln_eps: float = 1e-5,
                                           rescale: bool = True):
    r"""Grouped Differential Attention (Lim et al., Motif Technologies, "Grouped Differential
    Attention", 2025, arXiv 2510.06949).

    [paper, abstract] Heads are split *unevenly* into $H_s$ signal-preserving heads $(Q_1, K_1)$
    and $H_n = H_s/r$ noise-control heads $(Q_2, K_2)$; each noise head is shared by $r$ signal
    heads "through controlled repetition (akin to GQA)"; ratios 3:1 / 4:1 work best. The paper's
    method section could not be read here (only its abstract and third-party summaries), so the
    default follows the authors' released implementation instead:

    * [code] Motif Technologies' vLLM fork, ``MotifTechnologies/vllm``
      ``vllm/model_executor/models/motif.py`` (commit 477e4d7, ``MotifAttention``), and the GDA backend
      it calls, ``vllm-project/vllm`` ``vllm/v1/attention/backends/grouped_diff_attn.py`` (commit
      49902a1, ``GroupedDifferentialAttentionImpl.forward``): query half-heads in groups
      ``[Q1 x r, Q2]``; keys and values grouped GQA-style (``num_kv_heads`` $=2G$ key half-heads,
      ``k1, k2 = split_heads(k)``, ``v1, v2 = split_heads(v)``); every signal head attends with
      $(Q_1^i, K_1^{j(i)})$ to the value group $V^{j(i)}$ (width $2d$, ``cat([attn11, attn12])``), every
      noise head with $(Q_2^{n}, K_2^{j})$ to the same value group, the noise outputs are repeated
      $r$ times (``repeat(attn2, "... H D -> ... (H r) D", r=ratio)``), then
      ``attn1 - lambda_full * attn2`` → ``subln`` (``RMSNorm(2 * head_dim)``) → ``* (1 - lambda_init)``.
      λ is one scalar per layer with V1's re-parameterisation (``lambda_q1..k2``), $\lambda_{init} =
      0.8 - 0.6e^{-0.3(\text{layer\_idx}-1)}$ with the 0-based layer index
      (``lambda_init_convention="motif"``), RoPE rotate-half (``get_rope(..., is_neox_style=True)``),
      scale $d^{-1/2}$, causal:

    $$\mathrm{head}_i = (1-\lambda_{init})\,\mathrm{RMSNorm}_{2d}\bigl(\mathrm{softmax}(sQ_1^iK_1^{j(i)\top}+M)V^{j(i)}
      - \lambda\,\mathrm{softmax}(sQ_2^{g(i)}K_2^{j(i)\top}+M)V^{j(i)}\bigr),\qquad Y = [\mathrm{head}_i]_iW_o,$$

    $g(i) = \lfloor i/r\rfloor$, $j(i) = \lfloor i/(H_s/G)\rfloor$, $G \mid H_n$ (the vLLM backend asserts
    ``num_q2_heads % (num_kv_heads // 2) == 0``); $G$ defaults to $H_n$ (Motif-2-12.7B:
    ``num_attention_heads=40``, ``num_noise_heads=8``, ``num_key_value_heads=16``, i.e. $H_s=32$,
    $r=4$, $G=8$). ``noise_group_ratio=1`` is V1 exactly (``head_layout="grouped"`` ↔ V1
    ``pairing="adjacent"``, ``"split"`` ↔ ``"halves"``; with $G < H_s$ V1's ``gqa_pairing="flash"``).

    ``kv_layout="per_head"`` keeps the earlier reconstruction (not in the Motif code; unverified):
    one key half-head per query half-head (``k_proj`` laid out like ``q_proj``, $(H_s+H_n)$ half-heads)
    and one value head per signal head; the noise map of head $i$ multiplies head $i$'s own values.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        V1's names (weights ``(in, out)``): ``q_proj.weight (C, (H_s + H_n) d)`` laid out by
        ``head_layout`` (:func:`gda_head_index`); ``k_proj.weight (C, 2Gd)`` (:func:`gda_kv_index`) or,
        per head, ``(C, (H_s + H_n) d)``; ``v_proj.weight (C, G d_v)`` or ``(C, H_s d_v)`` ($d_v = 2d$
        upstream); ``out_proj.weight (H_s d_v, C_out)``; ``lambda_q1..lambda_k2 (d,)``;
        ``subln.weight (d_v,)``; optional ``*.bias``.
    num_signal_heads, noise_group_ratio : int
        $H_s$ and $r$ ($H_s$ divisible by $r$; $H_n = H_s/r$; Motif's ``num_attention_heads`` is
        $H_s + H_n$).
    head_layout : {"grouped", "split"}
    kv_layout : {"gqa", "per_head"}
    num_kv_heads : int, optional
        $G$ for ``kv_layout="gqa"`` (default $H_n$; upstream ``num_key_value_heads`` $= 2G$).
    depth, lambda_init, lambda_init_convention, attn_mask, is_causal, causal_alignment, rel_pos,
    rope_interleaved, scale, subln, subln_affine, subln_eps, rescale
        As :func:`refattn.attention.differential.diff_attention_v1_forward`, with the Motif defaults
        ``lambda_init_convention="motif"`` and ``rope_interleaved=False``.

    Returns
    -------
    out, cache
        The backward is V1's; the adjoint of the repetition sums the gradient of each noise
        half-head (and of each shared key/value group) over the signal heads that use it.
    """
    Hs = check_int(num_signal_heads, "num_signal_heads", minimum=1)
    r = check_int(noise_group_ratio, "noise_group_ratio", minimum=1)
    if Hs % r:
        raise ValueError(f"num_signal_heads ({Hs}) must be a multiple of noise_group_ratio ({r})")
    check_choice(head_layout, "head_layout", ("grouped", "split"))
    check_choice(kv_layout, "kv_layout", ("gqa", "per_head"))
    Hn = Hs // r
    if kv_layout == "per_head":
        if num_kv_heads is not None:
            raise ValueError("num_kv_heads applies to kv_layout='gqa' only (per_head has one key per query half-head)")
        G = None
    else:
        G = Hn if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
        if Hn % G:
            raise ValueError(f"the noise heads H_n = {Hn} must be a multiple of num_kv_heads ({G}) "
                             "(vLLM grouped_diff_attn: num_q2_heads % (num_kv_heads // 2) == 0)")
    if not isinstance(params, dict) or "q_proj.weight" not in params or "v_proj.weight" not in params:
        raise ValueError("params must be a dict containing 'q_proj.weight' (C, (H_s + H_n) d) and 'v_proj.weight'")
    cx = as_float(x, "x", min_ndim=2).shape[-1]
    check_weight_in(params, "q_proj.weight", cx, input_name="x")
    check_weight_in(params, "v_proj.weight", cx, input_name="x")
    qw, vw = np.shape(params["q_proj.weight"]), np.shape(params["v_proj.weight"])
    if len(qw) != 2 or qw[1] % (Hs + Hn):
        raise ValueError(f"q_proj.weight must have shape (C, (H_s + H_n) d) with H_s + H_n = {Hs + Hn}; got {qw}")
    v_heads = Hs if G is None else G
    if len(vw) != 2 or vw[1] % v_heads:
        raise ValueError(f"v_proj.weight must have shape (C, {'H_s' if G is None else 'G'} d_v) with "
                         f"{'H_s' if G is None else 'G'} = {v_heads}; got {vw}")
    d, dv = qw[1] // (Hs + Hn), vw[1] // v_heads
    if not isinstance(rescale, (bool, np.bool_)) or not isinstance(subln_affine, (bool, np.bool_)):
        raise TypeError("rescale and subln_affine must be bools")
    lam0 = resolve_lambda_init(depth, lambda_init, lambda_init_convention)
    sig, noise = gda_head_index(Hs, r, head_layout)
    if G is None:
        index, k_halves = (sig, noise, sig, noise, np.arange(Hs)), Hs + Hn
    else:
        k1, k2, vj = gda_kv_index(Hs, G, head_layout)
        index, k_halves = (sig, noise, k1, k2, vj), 2 * G
    out, cache = v1_generic_forward(
        x, params, where="grouped_differential_attention",
        names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "norm": "subln"},
        num_heads=Hs, q_halves=Hs + Hn, k_halves=k_halves, v_heads=v_heads, d=d, dv=dv, index=index,
        attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment, rel_pos=rel_pos,
        rope_interleaved=rope_interleaved, scale=scale, subln=subln, subln_affine=subln_affine,
        subln_eps=subln_eps, lambda_init_value=lam0, rescale=(1.0 - lam0) if rescale else 1.0,
        optional_bias=True)
    cache["lambda_init"] = lam0
    return out, cache


def grouped_differential_attention_backward(dout, cache):
    """Gradient of :func:`grouped_differential_attention_forward`: V1's chain; a noise half-head's
    query/key gradient is the sum over the $r$ signal heads that share it."""
    return v1_generic_backward(dout, cache)


def grouped_differential_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`grouped_differential_attention_forward`."""
    return grouped_differential_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _gda_params(rng, C, Hs, r, d, dv=None, lambda_init=0.5, kv_layout="gqa", G=None):
    dv = 2 * d if dv is None else dv
    Hn = Hs // r
    if kv_layout == "gqa":
        G = Hn if G is None else G
        kh, vh = 2 * G, G
    else:
        kh, vh = Hs + Hn, Hs
    P = {"q_proj.weight": rng.standard_normal((C, (Hs + Hn) * d)) / np.sqrt(C),
         "k_proj.weight": rng.standard_normal((C, kh * d)) / np.sqrt(C),
         "v_proj.weight": rng.standard_normal((C, vh * dv)) / np.sqrt(C),
         "out_proj.weight": rng.standard_normal((Hs * dv, C)) / np.sqrt(Hs * dv)}
    P.update(draw_lambda_vectors(rng, d, lambda_init))
    P["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(dv)
    return P


def _sample_gda(rng, size):
    if size == "tiny":
        B, n, C, Hs, r, d = 2, int(rng.integers(2, 4)), 3, 2, 2, 2
    else:
        B, n, C, Hs, r, d = 2, int(rng.integers(4, 7)), 6, 6, 3, 2
    depth = int(rng.integers(1, 6))
    layout = str(rng.choice(["grouped", "split"]))
    kv_layout = str(rng.choice(["gqa", "per_head"]))
    cfg = {"num_signal_heads": Hs, "noise_group_ratio": r, "head_layout": layout, "kv_layout": kv_layout,
           "depth": depth, "rel_pos": rope_tables(n, d)}
    G = None
    if kv_layout == "gqa":
        G = int(rng.choice([g for g in range(1, Hs // r + 1) if (Hs // r) % g == 0]))
        cfg["num_kv_heads"] = G
    return Sample(inputs={"x": rng.standard_normal((B, n, C))},
                  params=_gda_params(rng, C, Hs, r, d, lambda_init=lambda_init_fn(depth, "motif"),
                                     kv_layout=kv_layout, G=G),
                  config=cfg)


# The GDA defaults that differ from diff_attention_v1's (Motif code vs unilm code).
_GDA_V1_DEFAULTS = {"lambda_init_convention": "motif", "rope_interleaved": False}


def _check_gda_ratio_one_is_v1(rng):
    s = _sample_gda(rng, "small")
    x = s.inputs["x"]
    err = 0.0
    for kv_layout, G in (("gqa", None), ("gqa", 1), ("per_head", None)):
        P = _gda_params(rng, x.shape[-1], 2, 1, 2, kv_layout=kv_layout, G=G)
        extra = {} if G is None else {"num_kv_heads": G, "gqa_pairing": "flash"}
        for layout, pairing in (("grouped", "adjacent"), ("split", "halves")):
            kw = {} if kv_layout == "gqa" and G is None else {"kv_layout": kv_layout}
            if G is not None:
                kw["num_kv_heads"] = G
            a = grouped_differential_attention(x, P, num_signal_heads=2, noise_group_ratio=1, head_layout=layout,
                                               depth=2, rel_pos=s.config["rel_pos"], **kw)
            b = diff_attention_v1_forward(x, P, num_heads=2, depth=2, rel_pos=s.config["rel_pos"], pairing=pairing,
                                          **_GDA_V1_DEFAULTS, **extra)[0]
            err = max(err, float(np.abs(a - b).max()))
    assert err == 0.0, f"GDA with ratio 1 differs from V1 by {err}"
    return err


def _duplicated_v1(P, cfg, d):
    """V1 weights and keywords equal to a GDA layer: each noise query half-head is copied to its r
    signal heads (adjacent pairs for ``"grouped"``, halves for ``"split"``); the per-head key layout
    copies the noise keys the same way, the grouped one is V1's GQA with ``gqa_pairing="flash"``."""
    Hs, r, layout = cfg["num_signal_heads"], cfg["noise_group_ratio"], cfg.get("head_layout", "grouped")
    sig, noise = gda_head_index(Hs, r, layout)
    cols = np.arange(P["q_proj.weight"].shape[1]).reshape(-1, d)
    if layout == "grouped":
        order = np.stack([cols[sig], cols[noise]], axis=1).reshape(-1)  # (s_0, n_g(0), s_1, n_g(1), ...)
    else:
        order = np.concatenate([cols[sig], cols[noise]], axis=0).reshape(-1)
    Q = dict(P)
    Q["q_proj.weight"] = P["q_proj.weight"][:, order]
    vcfg = {k: v for k, v in cfg.items()
            if k not in ("num_signal_heads", "noise_group_ratio", "head_layout", "kv_layout", "num_kv_heads")}
    for k, v in _GDA_V1_DEFAULTS.items():
        vcfg.setdefault(k, v)
    vcfg["pairing"] = "adjacent" if layout == "grouped" else "halves"
    korder = None
    if cfg.get("kv_layout", "gqa") == "per_head":
        Q["k_proj.weight"] = P["k_proj.weight"][:, order]
        korder = order
    else:
        vcfg["num_kv_heads"] = cfg.get("num_kv_heads") or Hs // r
        vcfg["gqa_pairing"] = "flash"
    return Q, vcfg, order, korder


def _check_gda_noise_gradient_is_group_sum(rng):
    # GDA == V1 with duplicated noise weights; the GDA gradient of a noise column is the sum over copies.
    s = _sample_gda(rng, "small")
    x, P, cfg = s.inputs["x"], s.params, dict(s.config)
    Hs, r = cfg["num_signal_heads"], cfg["noise_group_ratio"]
    d = P["q_proj.weight"].shape[1] // (Hs + Hs // r)
    Q, vcfg, order, korder = _duplicated_v1(P, cfg, d)
    out, cache = grouped_differential_attention_forward(x, P, **cfg)
    ref, vcache = diff_attention_v1_forward(x, Q, num_heads=Hs, **vcfg)
    err = float(np.abs(out - ref).max())
    g = rng.standard_normal(out.shape)
    ga = grouped_differential_attention_backward(g, cache)
    gv = diff_attention_v1_backward(g, vcache)
    for key, idx in (("q_proj.weight", order), ("k_proj.weight", korder)):
        if idx is None:
            err = max(err, float(np.abs(ga[key] - gv[key]).max()))
            continue
        summed = np.zeros_like(P[key])
        np.add.at(summed.T, idx, gv[key].T)
        err = max(err, float(np.abs(ga[key] - summed).max()))
    for key in ("x", "v_proj.weight", "out_proj.weight", "subln.weight", *V1_LAMBDA_KEYS):
        err = max(err, float(np.abs(ga[key] - gv[key]).max()))
    assert err < 1e-11, f"GDA vs duplicated-noise V1: {err}"
    return err


def _check_gda_matches_vllm_transcription(rng):
    # Independent transcription of vLLM grouped_diff_attn.py (GroupedDifferentialAttentionImpl.forward)
    # with the motif.py projections: split_q_heads / split_heads / four attentions / repeat / subln.
    B, n, C, Hs, r, G, d = 2, 5, 6, 4, 2, 2, 2
    Hn = Hs // r
    x = rng.standard_normal((B, n, C))
    P = _gda_params(rng, C, Hs, r, d, lambda_init=lambda_init_fn(3, "motif"), G=G)
    cos, sin = rope_tables(n, d)
    out = grouped_differential_attention(x, P, num_signal_heads=Hs, noise_group_ratio=r, num_kv_heads=G, depth=3,
                                         rel_pos=(cos, sin))

    def rope_neox(t):  # (B, n, heads, d), rotate-half
        c, s_ = cos[:, None, :], sin[:, None, :]
        a, b = t[..., : d // 2], t[..., d // 2:]
        return np.concatenate([a * c - b * s_, a * s_ + b * c], axis=-1)

    q = rope_neox((x @ P["q_proj.weight"]).reshape(B, n, Hs + Hn, d))
    k = rope_neox((x @ P["k_proj.weight"]).reshape(B, n, 2 * G, d))
    v = (x @ P["v_proj.weight"]).reshape(B, n, 2 * G, d)
    qg = q.reshape(B, n, Hn, r + 1, d)                       # (num_groups group_size)
    q1, q2 = qg[:, :, :, :r].reshape(B, n, Hs, d), qg[:, :, :, r:].reshape(B, n, Hn, d)
    k1, k2 = k[:, :, 0::2], k[:, :, 1::2]                    # "(H two) D -> H two D"
    v1, v2 = v[:, :, 0::2], v[:, :, 1::2]
    keep = np.tril(np.ones((n, n), bool))

    def flash(qq, kk, vv):  # causal, GQA q head h -> kv head h // (Hq / Hkv)
        rep = qq.shape[2] // kk.shape[2]
        kk, vv = np.repeat(kk, rep, axis=2), np.repeat(vv, rep, axis=2)
        sc = np.einsum("bihd,bjhd->bhij", qq, kk) * d ** -0.5
        sc = np.where(keep, sc, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vv)

    attn1 = np.concatenate([flash(q1, k1, v1), flash(q1, k1, v2)], axis=-1)
    attn2 = np.repeat(np.concatenate([flash(q2, k2, v1), flash(q2, k2, v2)], axis=-1), r, axis=2)
    lam0 = 0.8 - 0.6 * np.exp(-0.3 * (3 - 1))
    lam = np.exp(P["lambda_q1"] @ P["lambda_k1"]) - np.exp(P["lambda_q2"] @ P["lambda_k2"]) + lam0
    a = attn1 - lam * attn2
    a = a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + 1e-5) * P["subln.weight"]
    ref = (a * (1 - lam0)).reshape(B, n, -1) @ P["out_proj.weight"]
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, f"GDA differs from the vLLM grouped_diff_attn transcription by {err}"
    return err


register(
    Mechanism(
        slug="grouped_differential_attention", family="2-differential", tier="T1",
        title="GDA: unbalanced signal / noise-control head groups",
        paper="Lim et al., 'Grouped Differential Attention', 2025, arXiv 2510.06949",
        forward=grouped_differential_attention_forward, backward=grouped_differential_attention_backward,
        sample=_sample_gda, docs="differential.md#grouped_differential_attention",
        checks={"ratio_one_is_v1": _check_gda_ratio_one_is_v1,
                "noise_gradient_is_group_sum": _check_gda_noise_gradient_is_group_sum,
                "matches_vllm_grouped_diff_attn": _check_gda_matches_vllm_transcription},
    ),
)
