r"""HeadMask: multi-head attention with training-time head masks (random or importance-based).

Sun, Huang, Dai, Chen, "Alleviating the Inequality of Attention Heads for Neural Machine
Translation", COLING 2022, arXiv 2009.09672. No code was released. The paper trains a Transformer
NMT model while masking attention heads, in two ways: ``Random`` (mask $n$ randomly chosen heads)
and ``Impt`` (mask the $n$ most important heads, importance as in Michel, Levy, Neubig, "Are
Sixteen Heads Really Better than One?", NeurIPS 2019, arXiv 1905.10650); at test time all heads
are used. Only the abstract and the catalogue's description were available here; the layer below
is the head-gate formulation both papers build on, and the selection rules are the two the
abstract and the results tables name ("Random-18", "Impt-18").

Forward
-------
With per-head gates $\xi_h$ (``head_mask``, 1 = keep, 0 = masked; Michel et al.'s $\xi_h$):

$$y_t = \Big[\ \rho\,\xi_h\ \mathrm{core}(q_h, k_h, v_h)_t\ \Big]_{h=1..H}\,W_O + b_O,$$

projections as fairseq's ``MultiheadAttention`` (``q_proj``/``k_proj``/``v_proj``/``out_proj``,
`refattn.blocks.core.head_gated_attention_forward`; any attention core). $\rho = 1$, or with
``rescale=True`` $\rho = H/\#\{h: \xi_h\ge\tfrac12\}$ (dropout-style; the papers do not say
whether surviving heads are rescaled, so this is a keyword, off by default — reconstruction).
``head_mask`` is ``(H,)`` (one mask for the batch) or ``x.shape[:-2] + (H,)`` (one per sequence).

Backward
--------
The head-gated attention VJP; $\partial L/\partial\xi_h = \rho\sum_t\langle dO_{t,h}, o_{t,h}\rangle$
is returned as the gradient of ``head_mask`` (summed over the batch for a shared mask). $\rho$
is held fixed (the count changes only where a gate crosses $\tfrac12$). This gradient *is*
Michel et al.'s importance signal: `head_importance` turns per-example gradients into
$I_h = \mathbb E_x|\partial L(x)/\partial\xi_h|$, normalised per layer by its $\ell_2$ norm.

Selection (forward-only utilities, no gradient)
-----------------------------------------------
`headmask_random` draws masks with exactly $n$ zeros per row (uniform over the
$\binom{H}{n}$ subsets); `headmask_important` masks the $n$ entries of an importance array with the
largest scores (over all of its entries, e.g. all layers' heads; ties to the lower flat index).
The training loop draws a mask per batch and passes it to the forward.

Conventions
-----------
``rescale`` (False), the core (``"sdpa"``, $1/\sqrt d$), fairseq names (``names`` may be timm's
fused ``("qkv", "proj")``), self-attention only (the cross-attention of an NMT decoder masks its
heads the same way: apply this layer's gating to that attention's heads).

Agreement with upstream
-----------------------
No upstream code exists. A float64 PyTorch autograd transcription of the formula (fairseq
layout, head outputs multiplied by $\rho\,\xi_h$ before ``out_proj``, as Michel et al.'s gating),
with shared and per-sequence masks, with and without ``rescale``: output and every gradient,
``head_mask`` included, agree to $1.1\times10^{-15}$ relative (the key bias, whose gradient is
zero in exact arithmetic, to $2.5\times10^{-16}$ absolute).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int
from ..registry import Mechanism, Sample, register
from .core import (
    SPLIT_QKV_NAMES,
    block_dtype,
    head_gated_attention_backward,
    head_gated_attention_forward,
    head_gated_attention_spec,
    param_dim,
    resolve_attention_core,
    split_block_params,
)

__all__ = ["headmask_attention_forward", "headmask_attention_backward", "headmask_attention", "headmask_random",
           "headmask_important", "head_importance"]


def _check_names(names):
    if not (isinstance(names, (tuple, list)) and len(names) in (2, 4) and all(isinstance(n, str) and n for n in names)):
        raise TypeError(f"names must be 4 prefixes (q, k, v, out) or 2 (fused qkv, out); got {names!r}")
    return tuple(names)


def headmask_attention_forward(x, head_mask, params, *, num_heads: int, rescale: bool = False, core=None,
                               core_config=None, names=SPLIT_QKV_NAMES):
    r"""Multi-head attention with head gates $\xi$ (module docstring), ``x (..., N, C)``.

    Parameters
    ----------
    x : array (..., N, C)
    head_mask : array (H,) or x.shape[:-2] + (H,)
        $\xi$: 1 keeps a head, 0 masks it (any real values act as gates).
    params : dict
        ``"q_proj.weight"``, ``"k_proj.weight"``, ``"v_proj.weight"`` ``(C, Hd)``,
        ``"out_proj.weight" (Hd, C)`` (PyTorch ``weight.T``), optional ``".bias"`` entries; a
        core's own parameters under ``"core."``.
    num_heads : int
    rescale : bool
        Multiply by $H/\#\{\xi_h\ge\frac12\}$ (reconstruction; False).
    core, core_config
        Attention core (default ``"sdpa"``) and its keyword configuration.
    names : 4 or 2 str
        Projection prefixes (fairseq split, or timm's fused ``("qkv", "proj")``).

    Returns
    -------
    y, cache
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(rescale, (bool, np.bool_)):
        raise TypeError(f"rescale must be a bool; got {type(rescale).__name__}")
    names = _check_names(names)
    m = as_float(head_mask, "head_mask", min_ndim=1)
    if m.shape not in ((h,), x.shape[:-2] + (h,)):
        raise ValueError(f"head_mask must have shape ({h},) or x's leading axes + (num_heads,) = "
                         f"{x.shape[:-2] + (h,)}; got {m.shape}")
    core = resolve_attention_core(core, prefix="core", config=core_config)
    c = x.shape[-1]
    out_w = 3 if len(names) == 2 else 1
    inner = param_dim(params, f"{names[0]}.weight", 1, where="headmask", shape=("C", "H*d")) // out_w
    if inner % h or inner == 0:
        raise ValueError(f"{names[0]}.weight's output width must be {out_w} * num_heads={h} * head_dim; "
                         f"got {inner * out_w}")
    spec = head_gated_attention_spec(names, c, h, inner // h)
    own, (cp,) = split_block_params(params, spec, (core,), optional=[k for k in spec if k.endswith(".bias")],
                                    where="headmask")
    dt = block_dtype(x, own, (cp, {"m": m}))
    x, own, cp, m = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, cp), m.astype(dt, copy=False)
    if rescale:
        kept = np.sum(m >= 0.5, axis=-1, keepdims=True)
        rho = np.where(kept > 0, h / np.maximum(kept, 1), 0.0).astype(dt)
    else:
        rho = np.ones(m.shape[:-1] + (1,), dtype=dt)
    g = m * rho
    gates = np.broadcast_to(g[..., None, :] if g.ndim > 1 else g, x.shape[:-1] + (h,))
    y, c_att = head_gated_attention_forward(own, x, gates, num_heads=h, core=core, core_params=cp, names=names)
    return y, {"x": x, "own": own, "att": c_att, "rho": rho, "mshape": m.shape, "dtype": dt}


def headmask_attention_backward(dout, cache):
    r"""Gradients of `headmask_attention_forward` for ``x``, ``head_mask`` and every params key."""
    x, dt = cache["x"], cache["dtype"]
    g = as_dout(dout, x.shape, dt)
    grads: dict = {}
    dx, dgates = head_gated_attention_backward(grads, cache["own"], g, cache["att"])
    dm = np.sum(dgates, axis=-2)
    if len(cache["mshape"]) == 1:
        dm = dm.reshape(-1, dm.shape[-1]).sum(axis=0)
    grads["x"] = dx
    grads["head_mask"] = dm * (cache["rho"] if cache["rho"].ndim == dm.ndim else cache["rho"].reshape(-1))
    return grads


def headmask_attention(x, head_mask, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `headmask_attention_forward`."""
    return headmask_attention_forward(x, head_mask, params, **config)[0]


def headmask_random(rng, num_heads: int, num_masked: int, batch_shape=()) -> np.ndarray:
    """HeadMask ``Random``: 0/1 masks ``batch_shape + (H,)`` with exactly ``num_masked`` zeros per row,
    uniform over the subsets (``rng`` a NumPy ``Generator``)."""
    h = check_int(num_heads, "num_heads", minimum=1)
    n = check_int(num_masked, "num_masked", minimum=0)
    if n > h:
        raise ValueError(f"num_masked must be <= num_heads={h}; got {n}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    keys = rng.random(tuple(batch_shape) + (h,))
    order = np.argsort(keys, axis=-1)[..., :n]
    mask = np.ones(keys.shape)
    np.put_along_axis(mask, order, 0.0, axis=-1)
    return mask


def headmask_important(importance, num_masked: int) -> np.ndarray:
    """HeadMask ``Impt``: a 0/1 mask of ``importance``'s shape with zeros at its ``num_masked``
    largest entries (over all entries; ties to the lower flat index)."""
    imp = as_float(importance, "importance", min_ndim=1)
    n = check_int(num_masked, "num_masked", minimum=0)
    if n > imp.size:
        raise ValueError(f"num_masked must be <= importance.size={imp.size}; got {n}")
    flat = np.ones(imp.size)
    flat[np.argsort(-imp.reshape(-1), kind="stable")[:n]] = 0.0
    return flat.reshape(imp.shape)


def head_importance(dhead_mask, *, normalize: bool = True) -> np.ndarray:
    r"""Michel et al.'s head importance $I_h = \mathbb E_x|\partial L(x)/\partial\xi_h|$ from
    per-example gate gradients ``dhead_mask (B, ..., H)`` (``headmask_attention_backward``'s
    ``"head_mask"`` with a per-sequence mask): the mean over axis 0 of $|\cdot|$, then (with
    ``normalize``) divided by its $\ell_2$ norm over the last (head) axis, per layer."""
    g = as_float(dhead_mask, "dhead_mask", min_ndim=2)
    imp = np.mean(np.abs(g), axis=0)
    if normalize:
        nrm = np.sqrt(np.sum(imp * imp, axis=-1, keepdims=True))
        imp = imp / np.where(nrm > 0, nrm, 1.0)
    return imp


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, h, d, bias=True, names=SPLIT_QKV_NAMES):
    p = {}
    for n in names[:3]:
        p[f"{n}.weight"] = rng.standard_normal((c, h * d)) / np.sqrt(c)
        if bias:
            p[f"{n}.bias"] = 0.1 * rng.standard_normal(h * d)
    p[f"{names[3]}.weight"] = rng.standard_normal((h * d, c)) / np.sqrt(h * d)
    if bias:
        p[f"{names[3]}.bias"] = 0.1 * rng.standard_normal(c)
    return p


def _sample(rng, size):
    h = 3
    n, c, d = (3, 3, 1) if size == "tiny" else (int(rng.integers(4, 7)), 6, 2)
    x = rng.standard_normal((2, n, c))
    # per-sequence masks keep axis 0 a batch axis; the shared (H,) mask: tests/test_blocks_b3.py
    m = headmask_random(rng, h, int(rng.integers(0, h)), (2,))
    cfg = {"num_heads": h, "rescale": bool(rng.random() < 0.4), "core_config": {"is_causal": bool(rng.random() < 0.5)}}
    return Sample(inputs={"x": x, "head_mask": m}, params=_params(rng, c, h, d, bool(rng.random() < 0.7)), config=cfg)


def _reference(x, head_mask, params, num_heads, rescale=False, core_config=None, **_):
    # Heads as explicit softmax attention, each multiplied by its gate, then out_proj.
    h = num_heads
    causal = bool((core_config or {}).get("is_causal", False))
    q, k, v = (x @ params[f"{n}_proj.weight"] + params.get(f"{n}_proj.bias", 0.0) for n in "qkv")
    d = q.shape[-1] // h
    m = np.broadcast_to(head_mask, x.shape[:-2] + (h,))
    out = np.zeros(q.shape)
    n = x.shape[-2]
    for idx in np.ndindex(*x.shape[:-2]):
        rho = h / max((m[idx] >= 0.5).sum(), 1) if rescale else 1.0
        for hh in range(h):
            sl = slice(hh * d, (hh + 1) * d)
            sc = q[idx][:, sl] @ k[idx][:, sl].T / np.sqrt(d)
            if causal:
                sc = np.where(np.tril(np.ones((n, n), bool)), sc, -np.inf)
            a = np.exp(sc - sc.max(-1, keepdims=True))
            out[idx][:, sl] = rho * m[idx][hh] * (a / a.sum(-1, keepdims=True)) @ v[idx][:, sl]
    return out @ params["out_proj.weight"] + params.get("out_proj.bias", 0.0)


def _mha_params(p):
    mp = {f"{n}_proj": p[f"{n}_proj.weight"] for n in ("q", "k", "v", "out")}
    mp.update({f"{n}_proj_bias": p[f"{n}_proj.bias"] for n in ("q", "k", "v", "out") if f"{n}_proj.bias" in p})
    return mp


def _check_all_ones_is_mha(rng):
    # Catalogue: an all-ones mask is multi-head attention (rescale or not).
    from .. import registry

    s = _sample(rng, "small")
    x, p = s.inputs["x"], s.params
    ref = registry.get("multi_head_attention").forward(x, params=_mha_params(p), num_heads=3)[0]
    err = max(float(np.abs(headmask_attention(x, np.ones(3), p, num_heads=3, rescale=r) - ref).max())
              for r in (False, True))
    assert err < 1e-13, f"all-ones HeadMask differs from MHA by {err}"
    return err


def _check_masked_head_is_pruned(rng):
    # Masking head h equals MHA with head h's rows of out_proj zeroed (the head pruned).
    from .. import registry

    s = _sample(rng, "small")
    x, p = s.inputs["x"], dict(s.params)
    d = p["q_proj.weight"].shape[1] // 3
    y = headmask_attention(x, np.array([1.0, 0.0, 1.0]), p, num_heads=3)
    p["out_proj.weight"] = p["out_proj.weight"].copy()
    p["out_proj.weight"][d:2 * d] = 0.0
    ref = registry.get("multi_head_attention").forward(x, params=_mha_params(p), num_heads=3)[0]
    err = float(np.abs(y - ref).max())
    assert err < 1e-13, f"masked head differs from the pruned head by {err}"
    return err


register(
    Mechanism(
        slug="headmask", family="5-building-blocks", tier="T2",
        title="HeadMask: attention with training-time head masks (random / importance-based), mask gradient = head importance",
        paper="Sun, Huang, Dai, Chen, Alleviating the Inequality of Attention Heads for Neural Machine Translation, "
              "COLING 2022, arXiv 2009.09672",
        forward=headmask_attention_forward, backward=headmask_attention_backward, sample=_sample, reference=_reference,
        docs="blocks/routing-and-gating.md#headmask",
        checks={"all_ones_mask_is_mha": _check_all_ones_is_mha, "masked_head_is_pruned": _check_masked_head_is_pruned},
    ),
)
