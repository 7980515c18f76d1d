r"""Poly-encoder code attention (Humeau et al.): learned codes pool the context, the candidate
attends over the pooled codes, and the score is a dot product.

With context states $H\in\mathbb R^{N\times d}$ (a transformer's outputs), $m$ learned codes
$C\in\mathbb R^{m\times d}$ and candidate embeddings $y_c\in\mathbb R^d$ ($c = 1..K$):

$$Y = \mathrm{softmax}\big(s_1\,C\,\tilde H^\top + M\big)\,H\in\mathbb R^{m\times d},\qquad
w_c = \mathrm{softmax}(s_2\,Y y_c)\in\mathbb R^m,\qquad
y^{ctx}_c = w_c^\top Y,\qquad \mathrm{score}_c = y^{ctx}_c\cdot y_c .$$

$\tilde H$ are the keys of the code attention: the context outputs ($\tilde H = H$,
``attention_keys="context"``, ParlAI's default) or the context's position embeddings
(``"position"``, passed as ``ctxt_pos``). $M$ masks padded context tokens (``ctxt_mask``, True =
token). ParlAI's ``"basic"`` attention has no scaling ($s = 1$), ``"sqrt"`` divides by $\sqrt d$:
``codes_attention_type`` and ``poly_attention_type`` choose $s_1$ and $s_2$ (default ``"basic"``
for both, as ParlAI).

Backward
--------
Two softmax-attention VJPs (the attention core, `refattn.attention.softmax.core`) and a dot
product: $dy^{ctx}_c = g_c\,y_c$ and $dy_c \mathrel{+}= g_c\,y^{ctx}_c$; the candidate attention
(query $y_c$, keys and values $Y$) gives $dy_c$ and $dY$ (key and value paths added); the code
attention gives $dC = \sum_b dQ$ (the codes are shared by the batch), $dH$ (values, plus keys when
$\tilde H = H$) and $d\,\mathrm{ctxt\_pos}$ (keys, ``"position"``).

Upstream: facebookresearch/ParlAI ``parlai/agents/transformer/polyencoder.py``
(``PolyEncoderModule.encode``/``score``, ``PolyBasicAttention``) and
``parlai/agents/transformer/modules/attention.py`` (``BasicAttention``) @
a29567f7ce76992fd1f03c51ba9e3b155a37ea51; ``attention_keys="position"`` is from the same file @
0043ea4ef8bef2bff4a49e3e4d7a3012c0e68ab8 (2020; the option was removed since, HEAD always uses the
context outputs as keys). ParlAI computes these softmaxes in float32 (``dtype=torch.float``) and
fills masked scores with $-10^{20}$ instead of $-\infty$ (a fully padded context then averages
all tokens; here its weights are zero). Not covered: the ``"multihead"`` attention types (an
ordinary MHA, `mha_forward`) and the ``"n_first"`` poly type (the first $m$ context outputs instead
of codes: a selection, no attention).
Paper: Humeau, Shuster, Lachaux, Weston, "Poly-encoders: Architectures and Pre-training Strategies
for Fast and Accurate Multi-sentence Scoring", ICLR 2020, arXiv 1905.01969.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_param_keys, compute_dtype
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward

__all__ = ["POLY_ATTENTION_TYPES", "poly_encoder_attention_forward", "poly_encoder_attention_backward",
           "poly_encoder_attention"]

POLY_ATTENTION_TYPES = ("basic", "sqrt")


def poly_encoder_attention_forward(ctxt, cand, params, ctxt_pos=None, *, ctxt_mask=None,
                                   codes_attention_type: str = "basic", poly_attention_type: str = "basic",
                                   attention_keys: str = "context"):
    r"""Poly-encoder scores: code attention over the context, candidate attention over the codes.

    Parameters
    ----------
    ctxt : array (B.., N, d)
        Context encoder outputs $H$.
    cand : array (B.., K, d)
        Candidate embeddings $y_c$.
    params : dict
        ``"codes" (m, d)`` (ParlAI's ``codes`` parameter).
    ctxt_pos : array (B.., N, d), optional
        Keys of the code attention when ``attention_keys="position"``.
    ctxt_mask : bool array (B.., N), optional
        True = real token (ParlAI's ``ctxt_mask``); masked tokens get zero weight.
    codes_attention_type, poly_attention_type : {"basic", "sqrt"}
        Score scale of the code attention / candidate attention: 1 (``basic``) or $1/\sqrt d$.
    attention_keys : {"context", "position"}

    Returns
    -------
    out, cache
        ``out (B.., K)``: one score per candidate.
    """
    ctxt = as_float(ctxt, "ctxt", min_ndim=2)
    cand = as_float(cand, "cand", ndim=ctxt.ndim)
    check_choice(codes_attention_type, "codes_attention_type", POLY_ATTENTION_TYPES)
    check_choice(poly_attention_type, "poly_attention_type", POLY_ATTENTION_TYPES)
    check_choice(attention_keys, "attention_keys", ("context", "position"))
    lead, n, d = ctxt.shape[:-2], ctxt.shape[-2], ctxt.shape[-1]
    if cand.shape[:-2] != lead or cand.shape[-1] != d:
        raise ValueError(f"cand must have shape {lead} + (K, d={d}); got {cand.shape} (ctxt {ctxt.shape})")
    if attention_keys == "position":
        if ctxt_pos is None:
            raise TypeError("ctxt_pos is required when attention_keys='position'")
        ctxt_pos = as_float(ctxt_pos, "ctxt_pos", ndim=ctxt.ndim)
        if ctxt_pos.shape != ctxt.shape:
            raise ValueError(f"ctxt_pos must have ctxt's shape {ctxt.shape}; got {ctxt_pos.shape}")
    elif ctxt_pos is not None:
        raise ValueError("ctxt_pos is only used with attention_keys='position'")
    if params is None:
        raise TypeError("params is required: a dict with 'codes' of shape (m, d)")
    check_param_keys(params, ["codes"], where="poly_encoder_attention", shapes={"codes": ("m", d)})
    codes = as_float(params["codes"], "codes", ndim=2)
    if codes.shape[1] != d:
        raise ValueError(f"codes must have shape (m, d={d}); got {codes.shape}")
    mask = None
    if ctxt_mask is not None:
        ctxt_mask = np.asarray(ctxt_mask)
        if ctxt_mask.dtype != np.bool_:
            raise TypeError(f"ctxt_mask must be a boolean array (True = token); got dtype {ctxt_mask.dtype}")
        if ctxt_mask.shape != lead + (n,):
            raise ValueError(f"ctxt_mask must have shape {lead + (n,)}; got {ctxt_mask.shape}")
        mask = ctxt_mask[..., None, None, :]
    dt = compute_dtype(ctxt, cand, ctxt_pos, codes)
    ctxt, cand, codes = ctxt.astype(dt, copy=False), cand.astype(dt, copy=False), codes.astype(dt, copy=False)
    keys = ctxt if ctxt_pos is None else ctxt_pos.astype(dt, copy=False)
    s1 = 1.0 if codes_attention_type == "basic" else float(d ** -0.5)
    s2 = 1.0 if poly_attention_type == "basic" else float(d ** -0.5)
    q1 = np.broadcast_to(codes, lead + (1,) + codes.shape)
    y_codes, c1 = attention_core_forward(q1, keys[..., None, :, :], ctxt[..., None, :, :], attn_mask=mask, scale=s1)
    final, c2 = attention_core_forward(cand[..., None, :, :], y_codes, y_codes, scale=s2)
    final = final[..., 0, :, :]
    out = np.sum(final * cand, axis=-1)
    cache = {"cand": cand, "final": final, "c1": c1, "c2": c2, "pos": ctxt_pos is not None, "out_shape": out.shape}
    return out, cache


def poly_encoder_attention_backward(dout, cache):
    """Gradient of :func:`poly_encoder_attention_forward`: ``ctxt``, ``cand``, ``codes`` (and
    ``ctxt_pos`` with ``attention_keys="position"``)."""
    cand, final = cache["cand"], cache["final"]
    g = as_dout(dout, cache["out_shape"], cand.dtype)[..., None]
    g2 = attention_core_backward((g * cand)[..., None, :, :], cache["c2"])
    g1 = attention_core_backward(g2["k"] + g2["v"], cache["c1"])
    grads = {"cand": g * final + g2["q"][..., 0, :, :],
             "codes": g1["q"].reshape((-1,) + g1["q"].shape[-2:]).sum(axis=0)}
    if cache["pos"]:
        grads["ctxt"], grads["ctxt_pos"] = g1["v"][..., 0, :, :], g1["k"][..., 0, :, :]
    else:
        grads["ctxt"] = (g1["k"] + g1["v"])[..., 0, :, :]
    return grads


def poly_encoder_attention(ctxt, cand, params, ctxt_pos=None, **config) -> np.ndarray:
    """Convenience wrapper: the scores of :func:`poly_encoder_attention_forward`."""
    return poly_encoder_attention_forward(ctxt, cand, params, ctxt_pos, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, k, m, d = int(rng.integers(2, 5)), 2, 2, 3
    else:
        n, k, m, d = int(rng.integers(4, 9)), 3, 4, 5
    inputs = {"ctxt": rng.standard_normal((2, n, d)), "cand": rng.standard_normal((2, k, d))}
    cfg = {"codes_attention_type": str(rng.choice(POLY_ATTENTION_TYPES)),
           "poly_attention_type": str(rng.choice(POLY_ATTENTION_TYPES))}
    if rng.random() < 0.4:
        cfg["attention_keys"] = "position"
        inputs["ctxt_pos"] = rng.standard_normal((2, n, d))
    if rng.random() < 0.5:
        mask = np.ones((2, n), bool)
        mask[1, -1] = False
        cfg["ctxt_mask"] = mask
    return Sample(inputs=inputs, params={"codes": rng.uniform(0, 1, (m, d))}, config=cfg)


def _reference(ctxt, cand, params, ctxt_pos=None, *, ctxt_mask=None, codes_attention_type="basic",
               poly_attention_type="basic", attention_keys="context"):
    # ParlAI's two BasicAttention calls written out per batch element
    codes = params["codes"]
    d = ctxt.shape[-1]
    s1 = 1.0 if codes_attention_type == "basic" else d ** -0.5
    s2 = 1.0 if poly_attention_type == "basic" else d ** -0.5
    keys = ctxt if attention_keys == "context" else ctxt_pos
    out = np.zeros(cand.shape[:-1])
    for b in range(ctxt.shape[0]):
        sel = np.ones(ctxt.shape[1], bool) if ctxt_mask is None else ctxt_mask[b]
        lg = s1 * codes @ keys[b][sel].T
        w = np.exp(lg - lg.max(-1, keepdims=True))
        y = (w / w.sum(-1, keepdims=True)) @ ctxt[b][sel]
        for c in range(cand.shape[1]):
            lg2 = s2 * y @ cand[b, c]
            w2 = np.exp(lg2 - lg2.max())
            out[b, c] = (w2 / w2.sum()) @ y @ cand[b, c]
    return out


def _check_one_code_is_attention_pooling(rng):
    # m = 1: the candidate attention has one key (weight 1), so the score is <softmax(c H^T) H, y_c>
    from .sdpa import sdpa

    ctxt, cand = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 3, 4))
    codes = rng.standard_normal((1, 4))
    s = poly_encoder_attention(ctxt, cand, {"codes": codes})
    pooled = sdpa(np.broadcast_to(codes, (2, 1, 1, 4)), ctxt[:, None], ctxt[:, None], scale=1.0)[:, 0, 0]
    err = float(np.abs(s - np.einsum("bd,bkd->bk", pooled, cand)).max())
    assert err < 1e-12, err
    return err


def _check_context_permutation_invariance(rng):
    ctxt, cand = rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 3, 4))
    mask = rng.random((2, 7)) < 0.8
    mask[:, 0] = True
    p = {"codes": rng.uniform(0, 1, (3, 4))}
    perm = rng.permutation(7)
    a = poly_encoder_attention(ctxt, cand, p, ctxt_mask=mask)
    b = poly_encoder_attention(ctxt[:, perm], cand, p, ctxt_mask=mask[:, perm])
    err = float(np.abs(a - b).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="poly_encoder_attention", family="1-softmax", tier="T2",
        title="Poly-encoder code attention (codes pool the context, candidate attends the codes)",
        paper="Humeau, Shuster, Lachaux, Weston, Poly-encoders: Architectures and Pre-training Strategies for Fast "
              "and Accurate Multi-sentence Scoring, ICLR 2020, arXiv 1905.01969",
        forward=poly_encoder_attention_forward, backward=poly_encoder_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/qkv-variants.md#poly-encoder-attention",
        checks={"one_code_is_attention_pooling": _check_one_code_is_attention_pooling,
                "context_permutation_invariance": _check_context_permutation_invariance},
    ),
)
