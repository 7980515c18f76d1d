r"""DIFF Transformer V1: the multi-head differential attention layer, exact unilm semantics.

The full unilm layer: projections, interleaved RoPE, half-head pairing, GQA pairing, $\lambda$
re-parameterisation, per-head RMSNorm, $(1-\lambda_{init})$, output projection. With $H$ =
``num_heads`` (half the baseline's head count), half-head width $d$, $s = d^{-1/2}$:

$$Q = XW_q\ (2H\text{ half-heads}),\ K = XW_k\ (2H_{kv}),\ V = XW_v\ (H_{kv}\text{ heads of }2d),$$
$$\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init},$$
$$\mathrm{head}_i = (1-\lambda_{init})\,\mathrm{RMSNorm}_{2d}\bigl((A_{i,1} - \lambda A_{i,2})V_i\bigr),
  \quad A_{i,a} = \mathrm{softmax}(s\,\mathrm{rope}(Q_{i,a})\,\mathrm{rope}(K_{i,a})^\top + M),$$
$$Y = [\mathrm{head}_1\|\dots\|\mathrm{head}_H]\,W_o .$$

Backward (derivation): the reverse of the forward, $dZ = GW_o^\top$, $dW_o = Z^\top G$ ($Z$ the
merged heads); split heads; $\times(1-\lambda_{init})$; RMSNorm VJP (gives ``subln.weight``); the
core VJP (``refattn.attention.differential.core``) with $d\lambda$ summed over batch, heads,
positions and channels; the λ re-parameterisation VJP
$d\lambda_{q1} = d\lambda\,e_1\lambda_{k1}$, $d\lambda_{k1} = d\lambda\,e_1\lambda_{q1}$,
$d\lambda_{q2} = -d\lambda\,e_2\lambda_{k2}$, $d\lambda_{k2} = -d\lambda\,e_2\lambda_{q2}$; RoPE VJP
(rotation by $-\theta$); the adjoint of the pairing/GQA gather (sums over every differential head
that used a half-head); $dX = \sum_p dY_p W_p^\top$ over the three projections. The pieces are
the shared layer helpers of ``refattn.attention.differential.layer`` (DiffCLIP, GDA and DINT run
the same chain).

Paper: Ye, Dong, Xia, Sun, Zhu, Huang, Wei, "Differential Transformer", ICLR 2025, arXiv
2410.05258. Upstream: microsoft/unilm ``Diff-Transformer/multihead_diffattn.py``@637157e
(``MultiheadDiffAttn``), with the flash files ``multihead_flashdiff_1.py`` /
``multihead_flashdiff_2.py`` as the ``gqa_pairing="flash"`` option, ``rms_norm.py`` for the
per-head norm and ``kernel/rotary.py`` (``apply_rotary_emb(..., interleaved=True)``) for RoPE.
Conventions where upstream files disagree ($\lambda_{init}$ layer indexing, half-head pairing,
GQA pairing, causal rule, norm) are keywords of `diff_attention_v1_forward`.
"""

from __future__ import annotations

import numpy as np

from ...registry import Mechanism, register
from ._samples import sample_v1, v1_cases, v1_params, v1_sample_lambda_zero
from .core import PAPER_V1
from .layer import lambda_init_fn, rope_apply, v1_generic_backward, v1_layer_forward

__all__ = [
    "diff_attention_v1_forward",
    "diff_attention_v1_backward",
    "diff_attention_v1",
]


def diff_attention_v1_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                              depth: int | None = None, lambda_init: float | None = None,
                              lambda_init_convention: str = "unilm", attn_mask=None,
                              is_causal: bool | None = None, causal_alignment: str = "bottom_right",
                              rel_pos=None, rope_interleaved: bool = True, scale=None,
                              pairing: str = "adjacent", gqa_pairing: str = "naive",
                              subln: str = "rms", subln_affine: bool = True, subln_eps: float = 1e-5,
                              rescale: bool = True):
    r"""DIFF Transformer V1 multi-head differential attention layer (unilm semantics).

    Follows microsoft/unilm ``Diff-Transformer/multihead_diffattn.py`` (``MultiheadDiffAttn``),
    with the flash files ``multihead_flashdiff_1.py`` / ``multihead_flashdiff_2.py`` as the
    ``gqa_pairing="flash"`` option, ``rms_norm.py`` for the per-head norm and
    ``kernel/rotary.py`` (``apply_rotary_emb(..., interleaved=True)``) for RoPE. Paper: Ye et al.,
    "Differential Transformer", ICLR 2025, arXiv 2410.05258.

    With $H$ = ``num_heads`` (half the baseline's head count), half-head width $d$, $s = d^{-1/2}$:

    $$Q = XW_q\ (2H\text{ half-heads}),\ K = XW_k\ (2H_{kv}),\ V = XW_v\ (H_{kv}\text{ heads of }2d),$$
    $$\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init},$$
    $$\mathrm{head}_i = (1-\lambda_{init})\,\mathrm{RMSNorm}_{2d}\bigl((A_{i,1} - \lambda A_{i,2})V_i\bigr),
      \quad A_{i,a} = \mathrm{softmax}(s\,\mathrm{rope}(Q_{i,a})\,\mathrm{rope}(K_{i,a})^\top + M),$$
    $$Y = [\mathrm{head}_1\|\dots\|\mathrm{head}_H]\,W_o .$$

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        PyTorch ``state_dict`` names, linear weights transposed to ``(in, out)``:
        ``"q_proj.weight" (C, 2Hd)``, ``"k_proj.weight" (C, 2H_{kv}d)``,
        ``"v_proj.weight" (C, 2H_{kv}d)``, ``"out_proj.weight" (2Hd, C_out)``,
        ``"lambda_q1"``, ``"lambda_k1"``, ``"lambda_q2"``, ``"lambda_k2"`` ``(d,)`` and
        ``"subln.weight" (2d,)`` (only when ``subln_affine``). Optional ``"<proj>.bias"`` entries
        are accepted (unilm is bias-free). Load a checkpoint with
        ``{k: v.T if k.endswith("proj.weight") else v for k, v in sd.items()}``.
    num_heads, num_kv_heads : int
        Differential heads $H$ and kv heads $H_{kv}$ (default $H$); $d$ is inferred from
        ``q_proj.weight`` as ``out / (2H)``.
    depth, lambda_init, lambda_init_convention
        $\lambda_{init}$ = :func:`lambda_init_fn` ``(depth, lambda_init_convention)`` (unilm:
        ``depth`` is the 0-based layer index) or a fixed ``lambda_init`` (DiffCLIP: 0.8).
    attn_mask, is_causal, causal_alignment
        ``is_causal=None`` is unilm's rule: causal (``triu(-inf, 1 + src_len - tgt_len)``, i.e.
        bottom-right) when ``attn_mask`` is None, else only ``attn_mask``. The mask is shared by
        both maps of a head and broadcasts to ``(B, H, N, N)``. Fully masked rows give 0 (unilm:
        NaN).
    rel_pos : (cos, sin), optional
        RoPE tables ``(N_ro >= N, r/2)``, ``r <= d`` (see :func:`rope_tables`), applied to every
        query and key half-head; ``None`` = no RoPE.
    rope_interleaved : bool
        ``True`` (unilm, GPT-J pairs ``(2j, 2j+1)``) or ``False`` (rotate-half, GPT-NeoX).
    scale : float, optional
        Default $d^{-1/2}$ (half-head width, as unilm ``scaling``).
    pairing : {"adjacent", "halves"}
        Half-heads $(2i, 2i+1)$ (unilm) or $(i, H+i)$ (some ports); applies to queries and,
        under ``gqa_pairing="flash"``, to keys.
    gqa_pairing : {"naive", "flash"}
        See :func:`v1_pairing_index`; unilm's two files disagree when ``H / H_kv > 1``.
    subln, subln_affine, subln_eps
        Per-head norm over $2d$: ``"rms"`` (unilm ``RMSNorm(2d, eps=1e-5, elementwise_affine=True)``;
        the affine flag was False in the first release, PR #1644), ``"layer"`` (the paper's
        "GroupNorm applied to each head independently": mean-centred, with ``subln.weight`` and
        ``subln.bias`` of shape ``(2d,)`` shared by the heads) or ``"none"``.
    rescale : bool
        Multiply by $(1-\lambda_{init})$ after the norm (unilm: always).

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``; :func:`diff_attention_v1_backward` returns ``"x"`` and every
        params key.
    """
    return v1_layer_forward(
        x, params, num_heads=num_heads, num_kv_heads=num_kv_heads, depth=depth, lambda_init=lambda_init,
        lambda_init_convention=lambda_init_convention, attn_mask=attn_mask, is_causal=is_causal,
        causal_alignment=causal_alignment, rel_pos=rel_pos, rope_interleaved=rope_interleaved, scale=scale,
        pairing=pairing, gqa_pairing=gqa_pairing, subln=subln, subln_affine=subln_affine, subln_eps=subln_eps,
        rescale=rescale, integral=None)


def diff_attention_v1_backward(dout, cache):
    r"""Gradient of :func:`diff_attention_v1_forward` for ``x`` and every params key.

    Chain (reverse of the forward): $dZ = G W_o^\top$, $dW_o = Z^\top G$ ($Z$ the merged heads);
    split heads; $\times(1-\lambda_{init})$; RMSNorm VJP (:func:`subln_backward`, gives
    ``subln.weight``); the core VJP (derivation in ``refattn.attention.differential.core``) with
    $d\lambda$ summed over batch, heads, positions and channels; λ re-parameterisation
    (:func:`lambda_reparam_backward`); RoPE VJP (rotation by $-\theta$); the adjoint of the
    pairing/GQA gather (sums over every differential head that used a half-head);
    $dX = \sum_p dY_p W_p^\top$ over the three projections.
    """
    return v1_generic_backward(dout, cache)


def diff_attention_v1(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diff_attention_v1_forward`."""
    return diff_attention_v1_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _v1_reference_loop(x, params, *, num_heads, num_kv_heads=None, depth=None, lambda_init=None,
                       lambda_init_convention="unilm", attn_mask=None, is_causal=None,
                       causal_alignment="bottom_right", rel_pos=None, rope_interleaved=True,
                       scale=None, pairing="adjacent", gqa_pairing="naive", subln="rms",
                       subln_affine=True, subln_eps=1e-5, rescale=True):
    """unilm's naive file transcribed step by step (view, repeat_kv, 2H maps, view(.., 2, ..))."""
    H = num_heads
    Hkv = H if num_kv_heads is None else num_kv_heads
    n_rep = H // Hkv
    P = params
    B, n, C = x.shape
    d = P["q_proj.weight"].shape[1] // (2 * H)
    lam0 = lambda_init if lambda_init is not None else lambda_init_fn(depth, lambda_init_convention)
    q = (x @ P["q_proj.weight"]).reshape(B, n, 2 * H, d)
    k = (x @ P["k_proj.weight"]).reshape(B, n, 2 * Hkv, d)
    v = (x @ P["v_proj.weight"]).reshape(B, n, Hkv, 2 * d)
    if rel_pos is not None:
        cos, sin = rel_pos
        q = np.swapaxes(rope_apply(np.swapaxes(q, 1, 2), cos, sin, rope_interleaved), 1, 2)
        k = np.swapaxes(rope_apply(np.swapaxes(k, 1, 2), cos, sin, rope_interleaved), 1, 2)
    q = np.swapaxes(q, 1, 2)
    k, v = np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)
    if gqa_pairing == "naive":
        k = np.repeat(k, n_rep, axis=1)  # repeat_kv: each half-head n_rep times, contiguously
    else:  # flash: reshape keys to (Hkv, 2, d) and repeat kv heads
        k = np.repeat(k.reshape(B, Hkv, 2, n, d), n_rep, axis=1).reshape(B, 2 * H, n, d)
    v = np.repeat(v, n_rep, axis=1)
    s = d ** -0.5 if scale is None else scale
    w = (q * s) @ np.swapaxes(k, -1, -2)
    if is_causal is None:
        is_causal = attn_mask is None
    bias = np.zeros((n, n))
    if is_causal:
        bias = np.triu(np.full((n, n), -np.inf), 1)
    if attn_mask is not None:
        bias = bias + (np.where(attn_mask, 0.0, -np.inf) if attn_mask.dtype == bool else attn_mask)
    w = w + bias
    w = np.exp(w - w.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    lam = (np.exp(np.sum(P["lambda_q1"] * P["lambda_k1"])) - np.exp(np.sum(P["lambda_q2"] * P["lambda_k2"]))
           + lam0)
    w = w.reshape(B, H, 2, n, n)
    w = w[:, :, 0] - lam * w[:, :, 1]
    o = w @ v
    if subln != "none":
        if subln == "layer":
            o = o - np.mean(o, -1, keepdims=True)
        o = o / np.sqrt(np.mean(o ** 2, -1, keepdims=True) + subln_eps)
        if subln_affine:
            o = o * P["subln.weight"] + (P["subln.bias"] if subln == "layer" else 0.0)
    if rescale:
        o = o * (1 - lam0)
    o = np.swapaxes(o, 1, 2).reshape(B, n, H * 2 * d)
    return o @ P["out_proj.weight"]


def _check_v1_lambda_zero(rng):
    # lambda = 0 (e1 - e2 = -lambda_init): the layer is (1 - lambda_init) RMSNorm(A1 V) W_o.
    s, P, lam0 = v1_sample_lambda_zero(rng)
    out, cache = diff_attention_v1_forward(**s.inputs, params=P, **s.config)
    assert abs(float(cache["lam"])) < 1e-12
    ref = _v1_reference_loop(**s.inputs, params=dict(P, lambda_q2=P["lambda_q1"], lambda_k2=P["lambda_k1"]),
                             **dict(s.config, depth=None, lambda_init=0.0, rescale=False))
    # the reference above has lambda = lambda_init = 0 and no rescale; apply (1 - lambda_init).
    err = float(np.abs(out - (1 - lam0) * ref).max())
    assert err < 1e-12, f"lambda = 0 differs from the plain normed softmax path by {err}"
    return err


def _check_v1_pairings(rng):
    # MHA: naive and flash pairings coincide bit for bit; GQA with n_rep = 2: they differ.
    s = sample_v1(rng, "small")
    x = s.inputs["x"]
    P = v1_params(rng, x.shape[-1], 2, 2, 4)
    cfg = dict(s.config, num_kv_heads=2, subln="rms")
    a = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="naive"))
    b = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="flash"))
    assert np.array_equal(a, b), "naive and flash pairings differ under MHA"
    P = v1_params(rng, x.shape[-1], 2, 1, 4)
    cfg = dict(s.config, num_kv_heads=1, subln="rms")
    a = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="naive"))
    b = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="flash"))
    gap = float(np.abs(a - b).max())
    assert gap > 1e-3, "naive and flash pairings should differ when n_rep = 2"
    return 0.0


def _check_v1_causal(rng):
    s = sample_v1(rng, "small")
    x = s.inputs["x"]
    out = diff_attention_v1(x, s.params, **s.config)
    x2 = x.copy()
    x2[:, -1] += 1.0
    out2 = diff_attention_v1(x2, s.params, **s.config)
    err = float(np.abs(out[:, :-1] - out2[:, :-1]).max())
    assert err < 1e-13, f"the last token leaks into earlier outputs ({err})"
    assert np.abs(out[:, -1] - out2[:, -1]).max() > 1e-6
    return err


register(
    Mechanism(
        slug="diff_attention_v1", family="2-differential", tier="T1",
        title="Differential attention (DIFF Transformer V1, exact unilm semantics)",
        paper=PAPER_V1, forward=diff_attention_v1_forward, backward=diff_attention_v1_backward,
        sample=sample_v1, reference=_v1_reference_loop, docs="differential.md#diff_attention_v1",
        checks={"lambda_zero_is_normed_softmax": _check_v1_lambda_zero, "gqa_pairings": _check_v1_pairings,
                "causal_no_leakage": _check_v1_causal},
        cases=v1_cases(),
    ),
)
