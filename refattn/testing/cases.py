"""Compare cases for the softmax family: the battery :func:`~refattn.testing.compare_implementation` runs.

One passing case proves little: a causal mask aligned bottom-right instead of top-left agrees
with refattn whenever ``N == M``, a GQA head pairing that tiles instead of repeating agrees when
``H == Hkv``, and a softmax that returns NaN on an empty row agrees until a row is fully masked.
So each record gets named cases (``Mechanism.cases``, contract in :mod:`refattn.registry`), each a
builder ``case(rng, config) -> Sample``:

``sampler``
    The record's own sampler at ``"small"`` (random sizes and, without a caller config, random
    options).
``n_lt_m`` / ``n_gt_m`` / ``decode``
    Fewer queries than keys, more queries than keys, and a single query over 7 keys (one
    decoding step over a KV cache): where causal alignments differ.
``gqa``
    6 query heads over 1, 2 or 3 kv heads (the seed picks), ``N != M``: where head pairings differ.
``odd``
    Odd, non-power-of-two sizes everywhere (batch 3, 3 heads, N 7, M 11, head widths 5 and 7).
``masked_row``
    A boolean ``attn_mask`` (True = keep) with holes and fully masked rows: refattn's output and
    gradients are 0 there (PyTorch 2.13's SDPA agrees; an explicit softmax gives NaN).
``self`` / ``cross``
    (multi-head layers) self-attention (no ``context``) and cross-attention with ``N != M``.

The q/k/v cases are one generic builder, :func:`qkv_case`: the record's sampler, then q, k and v
redrawn at the case's sizes (same distribution) and the size-bound config re-derived. A builder
starts from the caller's ``config`` when one is given and only adds the data its case needs; where
the case cannot exist under that config it raises :class:`~refattn.registry.CaseNotApplicable`
(the report lists it as skipped, with the reason).

Reproduce one case: ``registry.get(slug).cases[name](np.random.default_rng(seed), config)``.
"""

from __future__ import annotations

import numpy as np

from .. import registry
from ..registry import CaseNotApplicable, Sample

__all__ = ["QKV_SIZES", "MHA_SIZES", "qkv_case", "mha_case", "masked_row_mask"]

# (b, h, hkv, n, m, d, dv) of the q/k/v cases; hkv None: drawn per seed from the divisors of h.
QKV_SIZES = {
    "n_lt_m": dict(b=2, h=2, hkv=2, n=3, m=8, d=4, dv=3),
    "n_gt_m": dict(b=2, h=2, hkv=2, n=8, m=3, d=4, dv=3),
    "decode": dict(b=2, h=2, hkv=2, n=1, m=7, d=4, dv=3),
    "gqa": dict(b=2, h=6, hkv=None, n=5, m=7, d=4, dv=3),
    "odd": dict(b=3, h=3, hkv=3, n=7, m=11, d=5, dv=7),
    "masked_row": dict(b=2, h=2, hkv=2, n=5, m=6, d=4, dv=3),
}


def _is_array(v) -> bool:
    if isinstance(v, (tuple, list)):
        return any(_is_array(x) for x in v)
    return isinstance(v, np.ndarray) or (hasattr(v, "__array__") and hasattr(v, "shape"))


def _pinned_arrays(config: dict | None) -> list[str]:
    """Config keys holding arrays: they fix the shapes, so a case with its own sizes cannot use them."""
    return sorted(k for k, v in (config or {}).items() if _is_array(v))


def _no_pinned_arrays(config, case):
    pinned = _pinned_arrays(config)
    if pinned:
        raise CaseNotApplicable(f"your config holds arrays sized for one shape ({', '.join(pinned)}); "
                                f"the {case!r} case draws its own sizes (pass sample= to compare one shape)")


def masked_row_mask(rng, b: int, h: int, n: int, m: int) -> np.ndarray:
    """Boolean ``(b, h, n, m)`` keep-mask with random holes, one fully masked row in every head of
    batch element 0 and another in head 0 of the last batch element; every other row keeps a key."""
    keep = rng.random((b, h, n, m)) < 0.7
    keep[..., int(rng.integers(m))] = True  # a key every row keeps, before the empty rows are cut
    keep[0, :, int(rng.integers(n))] = False
    keep[-1, 0, int(rng.integers(n))] = False
    return keep


def _redraw(rng, like: np.ndarray, shape: tuple) -> np.ndarray:
    """A fresh array of ``shape`` from the sampler's distribution (standard normal at its scale)."""
    scale = float(np.std(like)) if like.size > 1 else 1.0
    return rng.standard_normal(shape) * (scale if scale > 0 else 1.0)


def _alignment_for(n, m):
    # the samplers' choice: no fully masked causal row unless a case asks for one
    return "bottom_right" if m >= n else "top_left"


def qkv_case(rec: registry.Mechanism, name: str, *, extra=None):
    """Case ``name`` of :data:`QKV_SIZES` for a record whose sampler draws ``q, k, v`` in SDPA
    layout: the sampler's sample with q/k/v redrawn at the case's sizes.

    ``extra(rng, sample, sizes, config, caller_config) -> None`` edits the new sample's inputs,
    params and ``config`` in place for the record's other arguments (a bias of shape
    ``(b, h, n, m)``, an index map, mask options); ``config`` is the caller's (a copy) or the
    sampler's re-derived for the new sizes, and ``caller_config`` tells which (None: sampler's).
    ``masked_row`` adds a boolean ``attn_mask`` (see :func:`masked_row_mask`).
    """
    spec = QKV_SIZES[name]

    def build(rng, config=None):
        if config is not None:
            _no_pinned_arrays(config, name)
            if name == "masked_row" and "attn_mask" in config:
                raise CaseNotApplicable("your config sets attn_mask")
        s = rec.sample(rng, "small")
        sizes = dict(spec)
        if sizes["hkv"] is None:
            sizes["hkv"] = int(rng.choice([1, 2, 3]))
        b, h, hkv, n, m, d, dv = (sizes[k] for k in ("b", "h", "hkv", "n", "m", "d", "dv"))
        q, k, v = (s.inputs[x] for x in "qkv")
        inputs = dict(s.inputs)
        inputs["q"] = _redraw(rng, q, (b, h, n, d))
        inputs["k"] = _redraw(rng, k, (b, hkv, m, d))
        inputs["v"] = _redraw(rng, v, (b, hkv, m, dv))
        if config is None:
            cfg = dict(s.config)
            if "causal_alignment" in cfg:
                cfg["causal_alignment"] = _alignment_for(n, m)
        else:
            cfg = dict(config)
        out = Sample(inputs=inputs, params=None if s.params is None else dict(s.params), config=cfg)
        if extra is not None:
            extra(rng, out, sizes, cfg, config)
        if name == "masked_row":
            cfg["attn_mask"] = masked_row_mask(rng, b, h, n, m)
        return out

    build.__doc__ = f"{rec.slug} compare case {name!r}: sizes {spec}"
    return build


def _sampler_case(rec: registry.Mechanism, fill=None):
    """The record's sampler at ``"small"``. A caller's config replaces the sampler's; then
    ``fill(rng, cfg, sample, sampler_config)`` adds the data the case needs that it leaves out."""
    def build(rng, config=None):
        s = rec.sample(rng, "small")
        if config is None:
            return s
        _no_pinned_arrays(config, "sampler")
        out = Sample(s.inputs, s.params, dict(config))
        if fill is not None:
            fill(rng, out.config, out, s.config)
        return out

    build.__doc__ = f"{rec.slug} compare case 'sampler': the record's sampler at 'small'"
    return build


def _qkv_battery(rec, extra=None, fill=None, names=tuple(QKV_SIZES)):
    cases = {"sampler": _sampler_case(rec, fill)}
    cases.update({n: qkv_case(rec, n, extra=extra) for n in names})
    return cases


# ---- attention_masks: the mask options follow the case's sizes


def _mask_options(rng, sizes, cfg, caller_config, case):
    """Fill the size-bound options of ``attention_masks`` for the case's sizes: with the sampler's
    config, a mask kind is drawn as the sampler does; with the caller's, only what it leaves out
    (``key_lengths`` of a padding mask, ``seqlens_q/k`` of a block-diagonal one) is drawn."""
    b, n, m = sizes["b"], sizes["n"], sizes["m"]
    if caller_config is None:
        for key in ("window", "left", "right", "key_lengths", "seqlens_q", "seqlens_k", "mask_kind"):
            cfg.pop(key, None)
        kind = str(rng.choice(["causal", "sliding_window", "band", "padding", "block_diagonal"]))
        cfg["mask_kind"] = kind
        if kind == "sliding_window":
            cfg["window"] = 2
        elif kind == "band":
            cfg.update(left=1, right=1)
        elif kind == "padding":
            cfg["mask_kind"] = ("padding", "causal")
    kinds = cfg.get("mask_kind", "causal")
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if "padding" in kinds and "key_lengths" not in cfg:
        lo = 1 if case != "masked_row" else 0
        cfg["key_lengths"] = rng.integers(max(lo, m - 2), m + 1, size=b)
        if case == "masked_row":
            cfg["key_lengths"][-1] = 0  # batch element b-1 sees no key at all
    if "block_diagonal" in kinds and "seqlens_q" not in cfg:
        cut_q, cut_k = int(rng.integers(1, n)) if n > 1 else 1, int(rng.integers(1, m)) if m > 1 else 1
        cfg["seqlens_q"] = [cut_q, n - cut_q] if n > 1 else [n]
        cfg["seqlens_k"] = [cut_k, m - cut_k] if n > 1 else [m]


def _masks_case(rec, name):
    if name == "masked_row":
        # attention_masks builds its mask from options: a fully masked row comes from a padding
        # mask with a zero key length (batch element 1 sees no key), or from bottom-right causal
        # alignment with N > M (the first N - M rows see no key).
        def build(rng, config=None):
            if config is not None:
                _no_pinned_arrays(config, name)
            cfg = {"mask_kind": ("padding", "causal"), "causal_alignment": "top_left"} if config is None \
                else dict(config)
            kinds = cfg.get("mask_kind", "causal")
            kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
            sizes = dict(QKV_SIZES["masked_row"])
            padding = "padding" in kinds and "key_lengths" not in cfg  # _mask_options draws a zero length
            if not padding:
                if "causal" not in kinds or cfg.get("causal_alignment") != "bottom_right":
                    raise CaseNotApplicable(f"mask_kind {cfg.get('mask_kind')!r} with these options never masks a "
                                            f"whole row (a padding mask or bottom-right causal alignment can)")
                sizes.update(n=8, m=3)
            s = rec.sample(rng, "small")
            b, h, n, m, d, dv = (sizes[k] for k in ("b", "h", "n", "m", "d", "dv"))
            inputs = {"q": _redraw(rng, s.inputs["q"], (b, h, n, d)), "k": _redraw(rng, s.inputs["k"], (b, h, m, d)),
                      "v": _redraw(rng, s.inputs["v"], (b, h, m, dv))}
            _mask_options(rng, sizes, cfg, cfg, name)  # cfg is settled: only draw the lengths
            return Sample(inputs=inputs, config=cfg)

        build.__doc__ = f"{rec.slug} compare case 'masked_row': a padding mask with a zero key length"
        return build
    return qkv_case(rec, name, extra=lambda rng, s, sizes, cfg, caller: _mask_options(rng, sizes, cfg, caller, name))


# ---- additive_attention_bias: a dense bias (b, h|1, n, m) and a table with an index map (n, m)


def _bias_extra(rng, s, sizes, cfg, caller_config):
    b, h, n, m = sizes["b"], sizes["h"], sizes["n"], sizes["m"]
    if "bias" in s.inputs:
        heads = 1 if s.inputs["bias"].shape[-3] == 1 else h
        s.inputs["bias"] = _redraw(rng, s.inputs["bias"], (b, heads, n, m))
    if s.params is not None and "table" in s.params:
        t = s.params["table"].shape[0]
        s.params["table"] = _redraw(rng, s.params["table"], (t, h))
        cfg["index_map"] = rng.integers(0, t, size=(n, m))


# ---- multi_head_attention / gqa_mqa: token-major x (b, n, c), optional context (b, m, cc)

# (b, n, m, c, h, d): m None is self-attention. kv heads: the caller's num_kv_heads, else H for
# multi_head_attention and a divisor of H below H (drawn per seed) for gqa_mqa.
MHA_SIZES = {
    "self": dict(b=2, n=6, m=None, c=8, h=4, d=3),
    "cross": dict(b=2, n=4, m=9, c=8, h=4, d=3),
    "n_gt_m": dict(b=2, n=9, m=4, c=8, h=4, d=3),
    "gqa": dict(b=2, n=5, m=7, c=8, h=6, d=2),
    "odd": dict(b=3, n=7, m=11, c=9, h=3, d=5),
    "masked_row": dict(b=2, n=5, m=6, c=8, h=2, d=3),
    # the common decoder layer: causal self-attention with rotary q/k (HF LLaMA-style)
    "causal_rope": dict(b=2, n=7, m=None, c=8, h=4, d=4),
}
# the RoPE of "causal_rope" without a caller's config: HF's rotate-half, Llama 3's theta
CAUSAL_ROPE = {"base": 500000.0, "interleaved": False}


def mha_case(rec: registry.Mechanism, name: str, *, grouped: bool = False):
    """Case ``name`` of :data:`MHA_SIZES` (or ``"sampler"``: the sampler's sizes) for a multi-head
    layer ``(x, context, params, num_heads, num_kv_heads ...)``: fresh inputs and projection
    weights for the case's sizes. The caller's ``num_heads`` / ``num_kv_heads`` are kept when given
    (the projection widths follow them)."""
    spec = MHA_SIZES.get(name)

    def build(rng, config=None):
        # imported here, not at registry load: a moved helper breaks this case, not the registry
        from ..attention.softmax import init_mha_params

        if config is not None:
            _no_pinned_arrays(config, name)
            if name == "masked_row" and "attn_mask" in config:
                raise CaseNotApplicable("your config sets attn_mask")
        s = rec.sample(rng, "small")
        if spec is None:  # "sampler": the sampler's own sample, or its sizes under the caller's config
            if config is None:
                return s
            x, ctx, h = s.inputs["x"], s.inputs.get("context"), int(s.config["num_heads"])
            z = dict(b=x.shape[0], n=x.shape[-2], m=None if ctx is None else ctx.shape[-2], c=x.shape[-1], h=h,
                     d=s.params["q_proj"].shape[1] // h)
        else:
            z = dict(spec)
        z["hkv"] = None
        if config is not None:
            cfg = dict(config)
        elif name == "causal_rope":  # the plain decoder layer: none of the sampler's torch-MHA options
            cfg = {"is_causal": True, "rope": dict(CAUSAL_ROPE)}
        else:  # the sampler's options, less its masks: they are sized for the sampler's N and M
            cfg = {k: v for k, v in s.config.items() if k not in ("key_padding_mask", "attn_mask")}
        if config is not None and "num_heads" in config:
            z["h"] = int(config["num_heads"])
        if config is not None and config.get("num_kv_heads") is not None:
            z["hkv"] = int(config["num_kv_heads"])
        elif grouped:
            divisors = [x for x in range(1, z["h"]) if z["h"] % x == 0]
            if not divisors:
                raise CaseNotApplicable(f"num_heads={z['h']} has no smaller number of kv heads")
            z["hkv"] = int(rng.choice(divisors))
        else:
            z["hkv"] = z["h"]
        if grouped and z["hkv"] == z["h"]:
            raise CaseNotApplicable(f"your config pins num_kv_heads == num_heads ({z['h']}): no grouping")
        if name == "causal_rope" and config is not None and config.get("rope") is None:
            raise CaseNotApplicable("your config sets no rope")
        rope = (CAUSAL_ROPE if name == "causal_rope" else s.config.get("rope")) if config is None else config.get("rope")
        if rope and (rope is True or rope.get("rotary_dim") is None):
            z["d"] += z["d"] % 2  # RoPE over the whole head needs an even head width
        b, n, m, c, h, hkv, d = (z[k] for k in ("b", "n", "m", "c", "h", "hkv", "d"))
        x = _redraw(rng, s.inputs["x"], (b, n, c))
        inputs = {"x": x}
        cc = c
        if m is not None:
            cc = c + 1
            inputs["context"] = rng.standard_normal((b, m, cc))
        bias = not grouped or bool(rng.random() < 0.5)
        params = init_mha_params(rng, c, h, d, num_kv_heads=hkv, c_context=cc, bias=bias)
        if config is None:
            cfg.update(num_heads=h, num_kv_heads=hkv)
            if m is not None:
                cfg.pop("is_causal", None)
        else:
            cfg.setdefault("num_heads", h)
            if grouped:
                cfg.setdefault("num_kv_heads", hkv)
        if name == "masked_row":
            cfg["attn_mask"] = masked_row_mask(rng, b, h, n, n if m is None else m)
        return Sample(inputs=inputs, params=params, config=cfg)

    build.__doc__ = f"{rec.slug} compare case {name!r}: sizes {spec}"
    return build


def _mha_battery(rec, grouped):
    names = ["sampler"] + [n for n in MHA_SIZES if grouped or n != "gqa"]
    return {n: mha_case(rec, n, grouped=grouped) for n in names}


registry.add_cases("sdpa", _qkv_battery(registry.get("sdpa")))
def _fill_masks(rng, cfg, s, sampler_config):
    q, k = s.inputs["q"], s.inputs["k"]
    _mask_options(rng, {"b": q.shape[0], "n": q.shape[-2], "m": k.shape[-2]}, cfg, cfg, "sampler")


registry.add_cases("attention_masks", {"sampler": _sampler_case(registry.get("attention_masks"), _fill_masks),
                                       **{n: _masks_case(registry.get("attention_masks"), n) for n in QKV_SIZES}})
def _fill_index_map(rng, cfg, s, sampler_config):
    # the bias table (a param) is gathered through the index map: the sampler's map goes with it
    if "index_map" not in cfg and "index_map" in sampler_config:
        cfg["index_map"] = sampler_config["index_map"]


registry.add_cases("additive_attention_bias", _qkv_battery(registry.get("additive_attention_bias"), extra=_bias_extra,
                                                           fill=_fill_index_map))
registry.add_cases("multi_head_attention", _mha_battery(registry.get("multi_head_attention"), grouped=False))
registry.add_cases("gqa_mqa", _mha_battery(registry.get("gqa_mqa"), grouped=True))
