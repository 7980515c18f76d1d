r"""Attention masks: padding, causal (with an offset), sliding-window / band and block-diagonal
keep-masks, and SDPA with a mask built from them (the ``attention_masks`` record).

Every builder returns a boolean *keep*-mask (True = keep, PyTorch's ``attn_mask`` polarity):

* `causal_mask` ``(n, m, offset=o)``: keep $j \le i + o$. ``offset=0`` is PyTorch's top-left
  alignment; ``offset=m-n`` is the KV-cache / flash-attn bottom-right alignment (unilm
  Diff-Transformer: ``torch.triu(full(-inf), 1 + offset)``).
* `band_mask` ``(n, m, left, right, offset)``: keep $-\text{left} \le j - (i + o) \le \text{right}$
  (flash-attn's ``window_size=(left, right)``, where ``-1`` means unbounded and $o = M - N$).
* `sliding_window_mask` ``(n, m, w, offset)``: keep $0 \le i + o - j < w$ (Mistral
  ``sliding_window``, Longformer/MASFormer causal band); with $w \ge m + |o|$ it is causal.
* `padding_mask` ``(key_lengths, m)``: ``(..., 1, 1, M)``, keep $j < \text{len}_b$. PyTorch's
  ``key_padding_mask`` means True = *padding*: pass its negation.
* `block_diagonal_mask` ``(seqlens_q, seqlens_k, causal=False)``: packed sequences (xformers
  ``BlockDiagonalMask`` and its causal variants).
* `to_additive` ``(keep, fill_value=-inf)``: the additive form. Upstream finite fills (Swin /
  Poseidon $-100$, IPOT $-\mathrm{finfo.max}$) turn a fully masked row into a uniform average of
  the values instead of refattn's 0.

`masked_attention_forward` is SDPA (`refattn.attention.softmax.sdpa`) with the keep-mask $K$
that `build_mask` builds from ``mask_kind`` (one kind, or a tuple of kinds combined by AND):

$$S_{ij} = \begin{cases} s\,q_i\cdot k_j & K_{ij}\\ -\infty & \text{otherwise}\end{cases},\qquad
O = \mathrm{softmax}(S)\,V.$$

Backward
--------
The SDPA VJP: a removed entry has $P_{ij} = 0$ and so $dS_{ij} = 0$; the mask itself is not
differentiated. A fully masked row gives $O_i = 0$ and zero gradients (refattn's convention, see
`refattn.nn.softmax`). A finite ``fill_value`` instead adds `to_additive`'s mask, which changes
fully masked rows and leaves a (tiny) gradient through removed entries.

Paper: standard; offset-causal as in microsoft/unilm ``Diff-Transformer/multihead_diffattn.py``@637157e.
"""

from __future__ import annotations

import numpy as np

from ..._checks import check_choice, compute_dtype, validate_qkv
from ...registry import Mechanism, Sample, register
from ._samples import random_qkv
from .core import CAUSAL_ALIGNMENTS, causal_keep, check_size
from .sdpa import sdpa, sdpa_backward, sdpa_forward

__all__ = [
    "MASK_KINDS",
    "causal_mask",
    "band_mask",
    "sliding_window_mask",
    "padding_mask",
    "block_diagonal_mask",
    "to_additive",
    "build_mask",
    "masked_attention_forward",
    "masked_attention_backward",
]

MASK_KINDS = ("causal", "padding", "sliding_window", "band", "block_diagonal")


def _validate_opt_int(value, name, minimum=None):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer or None; got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def causal_mask(n: int, m: int, *, offset: int = 0) -> np.ndarray:
    r"""Boolean keep-mask ``(n, m)`` of causal attention: keep $j \le i + o$.

    ``offset=0`` is PyTorch's top-left alignment; ``offset=m-n`` is the KV-cache / flash-attn
    bottom-right alignment (unilm Diff-Transformer: ``torch.triu(full(-inf), 1 + offset)``).
    """
    n, m = check_size(n, "n"), check_size(m, "m")
    offset = _validate_opt_int(offset, "offset")
    return np.tri(n, m, k=offset, dtype=bool)


def band_mask(n: int, m: int, *, left=None, right=0, offset: int = 0) -> np.ndarray:
    r"""Boolean keep-mask of a band around the (offset) diagonal: keep
    $-\text{left} \le j - (i + o) \le \text{right}$; ``None`` means unbounded on that side.

    This is flash-attn's ``window_size=(left, right)`` convention (there ``-1`` means unbounded and
    the diagonal is bottom-right aligned, i.e. ``offset = m - n``). ``left=None, right=0`` is
    causal; ``right=None`` with ``left=None`` keeps everything.
    """
    n, m = check_size(n, "n"), check_size(m, "m")
    left, right = _validate_opt_int(left, "left", 0), _validate_opt_int(right, "right", 0)
    offset = _validate_opt_int(offset, "offset")
    rel = np.arange(m)[None, :] - (np.arange(n)[:, None] + offset)
    keep = np.ones((n, m), bool)
    if left is not None:
        keep &= rel >= -left
    if right is not None:
        keep &= rel <= right
    return keep


def sliding_window_mask(n: int, m: int, window: int, *, offset: int = 0) -> np.ndarray:
    r"""Causal sliding window of width $w$: keep $0 \le i + o - j < w$ (the query's own position
    and the $w-1$ before it; Mistral ``sliding_window``, Longformer/MASFormer causal band).

    Equals ``band_mask(n, m, left=w - 1, right=0, offset=o)``; with $w \ge m + |o|$ it is causal.
    """
    window = check_size(window, "window")
    return band_mask(n, m, left=window - 1, right=0, offset=offset)


def padding_mask(key_lengths, m: int) -> np.ndarray:
    r"""Key-padding keep-mask from valid lengths: ``key_lengths`` of shape ``(...)`` (one per
    batch element) gives ``(..., 1, 1, m)`` with keep $j < \text{len}$, ready to broadcast against
    scores ``(..., H, N, M)``.

    PyTorch's ``nn.MultiheadAttention(key_padding_mask=...)`` uses the *opposite* boolean
    convention (True = padding, ignored): pass ``~key_padding_mask[:, None, None, :]`` instead.
    """
    m = check_size(m, "m")
    lengths = np.asarray(key_lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"key_lengths must be an integer array; got dtype {lengths.dtype}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > m):
        raise ValueError(f"key_lengths must lie in [0, m={m}]; got range [{lengths.min()}, {lengths.max()}]")
    return (np.arange(m) < lengths[..., None])[..., None, None, :]


def block_diagonal_mask(seqlens_q, seqlens_k=None, *, causal: bool = False,
                        causal_alignment: str = "top_left") -> np.ndarray:
    r"""Block-diagonal (packed / chunked sequences) keep-mask ``(sum seqlens_q, sum seqlens_k)``:
    query $i$ of segment $a$ sees only keys of segment $a$ (xformers ``BlockDiagonalMask``).

    ``causal=True`` additionally applies a causal mask inside each block, aligned
    ``"top_left"`` (xformers ``BlockDiagonalCausalMask``) or ``"bottom_right"``
    (``BlockDiagonalCausalFromBottomRightMask``).
    """
    sq = [check_size(int(x) if isinstance(x, np.integer) else x, "seqlens_q") for x in seqlens_q]
    sk = sq if seqlens_k is None else [check_size(int(x) if isinstance(x, np.integer) else x, "seqlens_k")
                                       for x in seqlens_k]
    if len(sk) != len(sq):
        raise ValueError(f"seqlens_q ({len(sq)} segments) and seqlens_k ({len(sk)} segments) must agree")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    keep = np.zeros((sum(sq), sum(sk)), bool)
    i0 = j0 = 0
    for a, b in zip(sq, sk, strict=True):
        keep[i0:i0 + a, j0:j0 + b] = causal_keep(a, b, causal_alignment) if causal else True
        i0, j0 = i0 + a, j0 + b
    return keep


def to_additive(keep, fill_value: float = -np.inf, dtype=np.float64) -> np.ndarray:
    """Boolean keep-mask -> additive mask: 0 where kept, ``fill_value`` where removed.

    Upstream finite fills: Swin / Poseidon ``-100.0``; IPOT ``-torch.finfo(dtype).max``. A finite
    fill turns a fully masked row into a *uniform* average of the values instead of refattn's 0.
    """
    keep = np.asarray(keep)
    if keep.dtype != np.bool_:
        raise TypeError(f"keep must be a boolean mask; got dtype {keep.dtype}")
    fill = float(fill_value)
    if np.isnan(fill) or fill > 0:
        raise ValueError(f"fill_value must be <= 0 (or -inf); got {fill_value!r}")
    return np.where(keep, 0.0, fill).astype(dtype)



def build_mask(kind, n: int, m: int, *, key_lengths=None, offset=None, window=None, left=None, right=0,
               seqlens_q=None, seqlens_k=None, causal_alignment: str = "top_left"):
    """The keep-mask of one ``kind`` (or the AND of a tuple of kinds) for ``n`` queries, ``m`` keys.

    ``offset`` defaults to 0 for ``causal_alignment="top_left"`` and ``m - n`` for ``"bottom_right"``.
    """
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if not kinds:
        raise ValueError("mask_kind must name at least one kind")
    for k_ in kinds:
        check_choice(k_, "mask_kind", MASK_KINDS)
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    if offset is None:
        offset = 0 if causal_alignment == "top_left" else m - n
    keep = None
    for k_ in kinds:
        if k_ == "causal":
            mk = causal_mask(n, m, offset=offset)
        elif k_ == "padding":
            if key_lengths is None:
                raise ValueError("mask_kind 'padding' needs key_lengths")
            mk = padding_mask(key_lengths, m)
        elif k_ == "sliding_window":
            if window is None:
                raise ValueError("mask_kind 'sliding_window' needs window")
            mk = sliding_window_mask(n, m, window, offset=offset)
        elif k_ == "band":
            mk = band_mask(n, m, left=left, right=right, offset=offset)
        else:
            if seqlens_q is None:
                raise ValueError("mask_kind 'block_diagonal' needs seqlens_q")
            mk = block_diagonal_mask(seqlens_q, seqlens_k, causal=False)
            if mk.shape != (n, m):
                raise ValueError(f"seqlens_q/seqlens_k sum to {mk.shape}; expected (n={n}, m={m})")
        keep = mk if keep is None else keep & mk
    return keep


def masked_attention_forward(q, k, v, *, mask_kind="causal", key_lengths=None, offset=None, window=None,
                             left=None, right=0, seqlens_q=None, seqlens_k=None,
                             causal_alignment: str = "top_left", fill_value=None, scale=None,
                             kv_group_map: str = "contiguous"):
    r"""SDPA with a mask built by :func:`build_mask` (the ``attention_masks`` record).

    ``fill_value=None`` uses the boolean mask (removed entries are $-\infty$: fully masked rows
    give 0); a finite ``fill_value`` (e.g. Swin's ``-100``) adds :func:`to_additive` instead,
    which changes fully masked rows and leaves a (tiny) gradient through removed entries.

    Backward: :func:`masked_attention_backward` — $dS_{ij} = 0$ wherever $P_{ij} = 0$, otherwise
    the SDPA VJP; the mask itself is not differentiated.
    """
    q, k, v = validate_qkv(q, k, v)
    keep = build_mask(mask_kind, q.shape[-2], k.shape[-2], key_lengths=key_lengths, offset=offset,
                      window=window, left=left, right=right, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
                      causal_alignment=causal_alignment)
    if key_lengths is not None and np.shape(key_lengths) != q.shape[:-3]:
        raise ValueError(f"key_lengths must have the batch shape {q.shape[:-3]}; got {np.shape(key_lengths)}")
    mask = keep if fill_value is None else to_additive(keep, fill_value, compute_dtype(q, k, v))
    return sdpa_forward(q, k, v, attn_mask=mask, scale=scale, kv_group_map=kv_group_map)


def masked_attention_backward(dout, cache):
    """Gradient of :func:`masked_attention_forward`: ``{"q", "k", "v"}`` (the SDPA backward)."""
    return sdpa_backward(dout, cache)


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_masks(rng, size):
    b, h = 2, 2
    n, m, d = (int(rng.integers(2, 4)), int(rng.integers(3, 5)), 2) if size == "tiny" else \
        (int(rng.integers(5, 9)), int(rng.integers(6, 11)), 3)
    kind = str(rng.choice(["causal", "sliding_window", "band", "padding", "block_diagonal"]))
    cfg = {"mask_kind": kind, "causal_alignment": "bottom_right" if m >= n else "top_left"}
    if kind == "sliding_window":
        cfg["window"] = 2
    elif kind == "band":
        cfg.update(left=1, right=1)
    elif kind == "padding":
        cfg["mask_kind"] = ("padding", "causal")
        cfg["key_lengths"] = rng.integers(m - 1, m + 1, size=b)
    elif kind == "block_diagonal":
        m = n + 1
        cfg["seqlens_q"], cfg["seqlens_k"] = [1, n - 1], [2, n - 1]
    q = rng.standard_normal((b, h, n, d))
    k = rng.standard_normal((b, h, m, d))
    v = rng.standard_normal((b, h, m, d))
    return Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)


def _check_future_tokens(rng):
    q, k, v = random_qkv(rng, n=7, m=7)
    t = 3
    out = masked_attention_forward(q, k, v, mask_kind="causal")[0]
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[:, :, t + 1:] = rng.standard_normal(a[:, :, t + 1:].shape) * 10
    out2 = masked_attention_forward(q2, k2, v2, mask_kind="causal")[0]
    assert np.array_equal(out[:, :, :t + 1], out2[:, :, :t + 1]), "future tokens influenced the past"
    return 0.0


def _check_offset_causal(rng):
    q, k, v = random_qkv(rng, n=8, m=8)
    full = masked_attention_forward(q, k, v, mask_kind="causal")[0]
    last = masked_attention_forward(q[:, :, 5:], k, v, mask_kind="causal", offset=5)[0]
    err = float(np.abs(last - full[:, :, 5:]).max())
    assert err < 1e-12, err
    return err


def _check_band_wide_is_causal(rng):
    q, k, v = random_qkv(rng, n=5, m=5)
    full = masked_attention_forward(q, k, v, mask_kind="causal")[0]
    err = max(float(np.abs(masked_attention_forward(q, k, v, mask_kind="sliding_window", window=5)[0] - full).max()),
              float(np.abs(masked_attention_forward(q, k, v, mask_kind="band", left=9, right=0)[0] - full).max()))
    w2 = masked_attention_forward(q, k, v, mask_kind="sliding_window", window=2)[0]
    assert err < 1e-12 and np.abs(w2 - full).max() > 1e-3, err
    return err


def _check_bool_vs_additive(rng):
    q, k, v = random_qkv(rng)
    a = masked_attention_forward(q, k, v, mask_kind="band", left=1, right=2)[0]
    b = masked_attention_forward(q, k, v, mask_kind="band", left=1, right=2, fill_value=-np.inf)[0]
    c = masked_attention_forward(q, k, v, mask_kind="band", left=1, right=2, fill_value=-1e4)[0]
    err = float(np.abs(a - b).max())
    assert err == 0.0 and float(np.abs(a - c).max()) < 1e-12, err
    return err


def _check_block_diagonal(rng):
    q, k, v = random_qkv(rng, n=5, m=6)
    out = masked_attention_forward(q, k, v, mask_kind="block_diagonal", seqlens_q=[2, 3], seqlens_k=[4, 2])[0]
    ref = np.concatenate([sdpa(q[:, :, :2], k[:, :, :4], v[:, :, :4]), sdpa(q[:, :, 2:], k[:, :, 4:], v[:, :, 4:])],
                         axis=2)
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, err
    return err


def _check_padding(rng):
    q, k, v = random_qkv(rng, n=4, m=6)
    lens = np.array([3, 6])
    out = masked_attention_forward(q, k, v, mask_kind="padding", key_lengths=lens)[0]
    err = max(float(np.abs(out[i] - sdpa(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n])[0]).max())
              for i, n in enumerate(lens))
    assert err < 1e-12, err
    return err


def _check_masked_rows_zero_grad(rng):
    q, k, v = random_qkv(rng, n=4, m=3)
    with np.errstate(all="raise"):
        out, c = masked_attention_forward(q, k, v, mask_kind=("causal", "padding"), causal_alignment="bottom_right",
                                          key_lengths=np.array([3, 0]))
        g = masked_attention_backward(rng.standard_normal(out.shape), c)
    # bottom-right causal with N > M: row 0 sees no key; batch 1 has no valid key at all
    assert not out[:, :, 0].any() and not g["q"][:, :, 0].any()
    assert not out[1].any() and not any(x[1].any() for x in g.values())
    assert all(np.isfinite(x).all() for x in g.values())
    return 0.0


register(
    Mechanism(
        slug="attention_masks", family="1-softmax", tier="T1",
        title="Padding, causal (offset), sliding-window/band and block-diagonal masks",
        paper="standard; offset-causal as in microsoft/unilm Diff-Transformer multihead_diffattn.py",
        forward=masked_attention_forward, backward=masked_attention_backward, sample=_sample_masks,
        docs="softmax-attention.md#attention-masks",
        checks={"future_tokens_no_influence": _check_future_tokens, "offset_causal": _check_offset_causal,
                "wide_band_is_causal": _check_band_wide_is_causal, "bool_vs_additive": _check_bool_vs_additive,
                "block_diagonal": _check_block_diagonal, "padding": _check_padding,
                "masked_rows_zero": _check_masked_rows_zero_grad},
    ),
)
