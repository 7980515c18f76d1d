"""Argument validation shared by every public entry point.

Every forward validates its arguments here *before* any arithmetic, so that bad input raises a
``TypeError``/``ValueError`` that names the argument and states what was expected and what was
given, instead of a broadcasting error from deep inside NumPy or a crash inside a Numba kernel.

dtype policy (DESIGN.md): computation happens in the input's floating dtype; float16 and
bfloat16-like inputs are promoted to float32; float64 is never downcast; mixed float32/float64
inputs compute in float64.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Real

import numpy as np

__all__ = [
    "as_float",
    "as_bool_or_float_mask",
    "as_dout",
    "validate_qkv",
    "compute_dtype",
    "check_dim",
    "check_positive",
    "check_choice",
    "check_broadcastable",
    "check_int",
    "check_param_keys",
    "check_params",
    "weight_shape_hint",
    "shape_message",
    "check_weight_in",
    "cast_all",
]


def _describe(x) -> str:
    dt = getattr(x, "dtype", None)
    return f"dtype {dt}" if dt is not None else f"type {type(x).__name__}"


def as_float(
    x,
    name: str,
    *,
    ndim: int | None = None,
    min_ndim: int | None = None,
    max_ndim: int | None = None,
    finite: bool = True,
    allow_empty: bool = False,
) -> np.ndarray:
    """Return ``x`` as a floating NumPy array in its compute dtype, or raise naming ``name``.

    * ``TypeError`` for bool, integer, complex, object, string inputs and for ``longdouble``
      (which cannot be represented without silently dropping precision);
    * ``ValueError`` for a wrong number of dimensions, a zero-length axis (unless
      ``allow_empty``) or NaN/inf entries (unless ``finite=False``).

    float16 is promoted to float32; float32 and float64 are kept. The returned array may be the
    caller's own array: callers never write into it (inputs are never modified).
    """
    if x is None:
        raise TypeError(f"{name} is required; got None")
    if hasattr(x, "__array__") or isinstance(x, (list, tuple, Real, np.generic)):
        try:
            arr = np.asarray(x)
        except Exception as exc:  # ragged lists and exotic objects
            raise TypeError(f"{name} could not be converted to an array: {exc}") from None
    else:
        raise TypeError(f"{name} must be a floating-point array; got {type(x).__name__}")
    kind = arr.dtype.kind
    if kind != "f":
        raise TypeError(
            f"{name} must be a floating-point array (float16, float32 or float64); got {_describe(arr)}"
        )
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    elif arr.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float16, float32 or float64; got {_describe(arr)}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions; got shape {arr.shape} ({arr.ndim} dimensions)")
    if min_ndim is not None and arr.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions; got shape {arr.shape} ({arr.ndim} dimensions)"
        )
    if max_ndim is not None and arr.ndim > max_ndim:
        raise ValueError(
            f"{name} must have at most {max_ndim} dimensions; got shape {arr.shape} ({arr.ndim} dimensions)"
        )
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name} must not have a zero-length axis; got shape {arr.shape}")
    # min and max are NaN when any entry is NaN and infinite when any is infinite: two passes with
    # no temporary, ~1.5x faster than isfinite(arr).all() on arrays larger than the cache
    if finite and arr.size and not (np.isfinite(arr.min()) and np.isfinite(arr.max())):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def as_dout(dout, shape: tuple, dtype, *, name: str = "dout") -> np.ndarray:
    """Validate the upstream gradient of a backward: floating, exactly the output's ``shape``;
    returned in the forward's compute ``dtype`` (float16 upstream gradients are promoted).

    Every ``*_backward`` validates its ``dout`` here. NaN/inf entries are allowed (they propagate).
    ``name`` names a secondary upstream gradient in messages (``"dlse"``, ``"dp"``); its ``shape``
    is then that of the forward quantity it is the gradient of. Raises ``TypeError`` for a
    non-floating array and ``ValueError`` naming ``name`` for a wrong shape.
    """
    g = as_float(dout, name, finite=False, allow_empty=True)
    if g.shape != tuple(shape):
        what = "the forward output's shape" if name == "dout" else "shape"
        raise ValueError(f"{name} must have {what} {tuple(shape)}; got {g.shape}")
    return g.astype(dtype, copy=False)


def validate_qkv(q, k, v, *, qname="q", kname="k", vname="v"):
    """Attention inputs in PyTorch SDPA layout: ``q (..., H, N, d)``, ``k (..., Hkv, M, d)``,
    ``v (..., Hkv, M, dv)``, equal leading axes, ``H`` a multiple of ``Hkv``. Shared by the
    reference functions and the kernels, so both reject the same input with the same message."""
    q = as_float(q, qname, min_ndim=3)
    k = as_float(k, kname, min_ndim=3)
    v = as_float(v, vname, min_ndim=3)
    if k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"{qname}, {kname} and {vname} must have the same number of dimensions (..., heads, tokens, "
            f"features); got {qname} {q.shape}, {kname} {k.shape}, {vname} {v.shape}"
        )
    if k.shape[:-3] != q.shape[:-3] or v.shape[:-3] != q.shape[:-3]:
        raise ValueError(
            f"the leading (batch) axes of {qname}, {kname} and {vname} must be equal; got "
            f"{qname} {q.shape}, {kname} {k.shape}, {vname} {v.shape}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{kname} must have {qname}'s head width d={q.shape[-1]} on its last axis; got {k.shape}")
    if v.shape[-3] != k.shape[-3]:
        raise ValueError(f"{vname} must have {kname}'s number of kv heads {k.shape[-3]} on axis -3; got {v.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"{vname} must have {kname}'s number of keys M={k.shape[-2]} on axis -2; got {v.shape}")
    h, hkv = q.shape[-3], k.shape[-3]
    if h % hkv:
        raise ValueError(
            f"the number of query heads H={h} ({qname} axis -3) must be a multiple of the number of kv "
            f"heads Hkv={hkv} ({kname} axis -3)"
        )
    return q, k, v


def compute_dtype(*arrays) -> np.dtype:
    """The dtype the computation runs in: float64 if any array is float64, else float32."""
    dts = [a.dtype for a in arrays if a is not None]
    return np.result_type(*dts) if dts else np.dtype(np.float64)


def as_bool_or_float_mask(mask, name: str) -> np.ndarray:
    """Validate a mask: boolean (True = attend) or additive floating (0 / -inf allowed)."""
    if mask is None:
        return None
    try:
        arr = np.asarray(mask)
    except Exception as exc:
        raise TypeError(f"{name} could not be converted to an array: {exc}") from None
    if arr.dtype == np.bool_:
        return arr
    if arr.dtype.kind != "f":
        raise TypeError(f"{name} must be a boolean (True = keep) or floating additive mask; got {_describe(arr)}")
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise ValueError(f"{name} (additive) may contain finite values and -inf only; got NaN or +inf")
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    return arr


def check_dim(name_a: str, size_a: int, name_b: str, size_b: int, what: str) -> None:
    """Raise if two sizes that must agree do not."""
    if size_a != size_b:
        raise ValueError(f"{what} of {name_a} ({size_a}) and {name_b} ({size_b}) must agree")


def check_broadcastable(name: str, shape: tuple, target: tuple, target_desc: str) -> None:
    """Raise unless ``shape`` broadcasts to ``target`` (used for masks and biases)."""
    try:
        out = np.broadcast_shapes(tuple(shape), tuple(target))
    except ValueError:
        raise ValueError(
            f"{name} of shape {tuple(shape)} does not broadcast to {target_desc} {tuple(target)}"
        ) from None
    if out != tuple(target):
        raise ValueError(f"{name} of shape {tuple(shape)} does not broadcast to {target_desc} {tuple(target)}")


def check_positive(value, name: str, *, allow_zero: bool = False, allow_none: bool = False):
    """A finite positive real scalar (or None where allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    v = float(value)
    if not np.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}; got {value!r}")
    return v


def check_int(value, name: str, *, minimum: int | None = None) -> int:
    """An integer scalar (bool rejected) with an optional lower bound."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def check_choice(value, name: str, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


# --------------------------------------------------------------------------------------------
# Flat parameter dicts ({"q_proj.weight": array, ...})


def _for(where) -> str:
    return f" for {where}" if where else ""


def _incomplete_layers(params, extra, expected) -> dict[str, str]:
    """Keys that are probably missing although the caller's spec does not list them.

    A key ``prefix.suffix`` the spec does not know, whose layer ``prefix`` lacks a sibling the
    spec's layers always have (``keys.0.bias`` without ``keys.0.weight`` where every expected
    layer has ``weight`` and ``bias``), points at the sibling: a forward that chooses its layout
    from the keys present (self vs cross attention) then expects a different key set, and
    "unknown keys" alone would hide the one key that is missing. Returns {missing key: layer}."""
    layers: dict[str, set] = {}
    for key in expected:
        prefix, dot, suffix = key.rpartition(".")
        if dot:
            layers.setdefault(prefix, set()).add(suffix)
    groups = {frozenset(v) for v in layers.values() if len(v) > 1}
    present: dict[str, set] = {}
    for key in params:
        prefix, dot, suffix = key.rpartition(".")
        if dot:
            present.setdefault(prefix, set()).add(suffix)
    out = {}
    for key in extra:
        prefix, dot, _ = key.rpartition(".")
        if not dot or prefix in layers:
            continue
        for group in groups:
            if present[prefix] < group:
                out.update({f"{prefix}.{s}": prefix for s in sorted(group - present[prefix])})
    return out


def check_param_keys(params, required, optional=(), *, name: str = "params", where: str | None = None,
                     shapes: dict | None = None) -> None:
    """Validate the key set of a flat parameter dict (values are not looked at).

    * ``TypeError`` unless ``params`` is a dict;
    * ``ValueError`` naming every missing ``required`` key (with its expected shape when
      ``shapes`` has it) and every unknown key (neither required nor optional), with the closest
      expected name for each unknown one. A missing key is always reported as missing, also when
      unknown keys come with it (a misspelt key is both), and also when the caller's spec was
      chosen from the keys present: an unknown key whose layer lacks a sibling every expected
      layer has (``keys.0.bias`` without ``keys.0.weight``) names that sibling as missing.

    ``name`` names the dict and ``where`` (optional) the mechanism in messages. A key whose value
    is ``None`` counts as present here (:func:`check_params` decides what ``None`` means).
    """
    required, optional = tuple(required), tuple(optional)
    if not isinstance(params, dict):
        opt = f" and optional {list(optional)}" if optional else ""
        raise TypeError(f"{name}{_for(where)} must be a dict of arrays with keys {list(required)}{opt}; "
                        f"got {type(params).__name__}")
    expected = (*required, *optional)
    extra = sorted(set(params) - set(expected))
    missing = [k for k in required if k not in params]
    if not extra and not missing:
        return
    parts = []
    partial = _incomplete_layers(params, extra, expected)
    if partial:
        layers = sorted(set(partial.values()))
        have = {p: sorted(k.rpartition(".")[2] for k in params if k.rpartition(".")[0] == p) for p in layers}
        parts.append(f"{name} is missing keys {sorted(partial)}{_for(where)} ("
                     + ", ".join(f"layer {p!r} has only {have[p]}" for p in layers) + ")")
    if missing:
        hint = ""
        if shapes:
            hint = " (expected shapes: " + ", ".join(f"{k} {tuple(shapes[k])}" for k in missing if k in shapes) + ")"
        parts.append(f"{name} is missing keys {missing}{_for(where)}{hint}" if not parts
                     else f"against the expected keys it also lacks {missing}{hint}")
    if extra:
        import difflib

        # spelling guesses only where no layer is incomplete (then the layout, not a name, is off)
        guess = {} if partial else {k: difflib.get_close_matches(k, missing or expected, n=1, cutoff=0.75)
                                    for k in extra}
        typo = "; ".join(f"{k!r} -> {c[0]!r}?" for k, c in guess.items() if c)
        what = f"unknown keys {extra}" + (f" (did you mean {typo})" if typo else "")
        parts.append(f"it has {what}" if parts else f"{name} has {what}{_for(where)}")
    opt = f" and optional {sorted(optional)}" if optional else ""
    raise ValueError("; ".join(parts) + f"; expected {sorted(required)}{opt}")


def check_params(params, spec: dict, *, name: str = "params", optional=(), where: str | None = None) -> dict:
    """Validate a flat parameter dict against ``spec`` (key -> expected shape) and return its arrays.

    Keys in ``optional`` may be absent or ``None`` (then they are left out of the result). Raises

    * ``TypeError`` when ``params`` is not a dict, a value is not a floating array (naming the
      key), or a required key is ``None``;
    * ``ValueError`` for unknown keys, missing required keys (see :func:`check_param_keys`) and
      wrong shapes: ``"<key> must have shape <expected>; got <given>"`` (for a 2-D ``*.weight``,
      with the reason :func:`weight_shape_hint` finds: PyTorch's transposed layout, or a changed
      input width).

    Returns ``{key: float array}`` in ``spec`` order, each in its own dtype (float16 promoted to
    float32; see :func:`as_float`); cast them together with :func:`cast_all`.
    """
    optional = tuple(optional)
    check_param_keys(params, [k for k in spec if k not in optional], [k for k in spec if k in optional],
                     name=name, where=where, shapes=spec)
    out = {}
    for key, shape in spec.items():
        if key in optional and params.get(key) is None:
            continue
        arr = as_float(params[key], key)
        if arr.shape != tuple(shape):
            raise ValueError(shape_message(key, arr.shape, tuple(shape)))
        out[key] = arr
    return out


def shape_message(key: str, got: tuple, expected: tuple) -> str:
    """``"<key> must have shape <expected>; got <given>"`` plus :func:`weight_shape_hint`'s reason,
    except where a 2-D ``*weight`` reads as PyTorch's ``(out, in)`` layout (its axis 1 is the
    expected input width, its axis 0 is not): then the message leads with the transpose and does
    not state ``expected``'s output width, which a caller may have read off the wrong axis of this
    very weight (a transposed ``fc1 (C, hidden)`` makes a layer expect ``(C, C)``)."""
    got, expected = tuple(got), tuple(expected)
    if (key.endswith("weight") and len(got) == 2 and len(expected) == 2 and got[0] != expected[0]
            and got[1] == expected[0] and got != expected[::-1] and got[1] == expected[1]):
        return (f"{key} must have {expected[0]} rows (refattn weights are (in, out) and {expected[0]} features "
                f"arrive); got {got}: if this is PyTorch's nn.Linear.weight (out, in), pass its transpose, of "
                f"shape {got[::-1]}; if it is already (in, out), axis 0 is the input width: this weight takes "
                f"{got[0]} features, so did the last axis of an input change?")
    return f"{key} must have shape {expected}; got {got}{weight_shape_hint(key, got, expected)}"


def weight_shape_hint(key: str, got: tuple, expected: tuple) -> str:
    """Why a 2-D ``*.weight`` of shape ``got`` is not the ``(in, out)`` one ``expected``: PyTorch's
    ``(out, in)`` layout when the expected input width sits on axis 1 (transposing fixes it); a
    different input width when axis 0 differs and axis 1 does not explain it; nothing otherwise."""
    got, expected = tuple(got), tuple(expected)
    if not (key.endswith("weight") and len(got) == 2 and len(expected) == 2):
        return ""
    transpose = "PyTorch's nn.Linear.weight is (out, in): pass its transpose"
    if got[0] == expected[0]:
        return ""
    width = f"axis 0 is the input width: this weight takes {got[0]} features where {expected[0]} arrive"
    if got == expected[::-1] or (got[1] == expected[0] and got[1] != expected[1]):
        return f" ({transpose}, of shape {got[::-1]})"
    if got[1] == expected[0]:  # (c, a) for (a, a): a changed input, or a transposed (a, c) weight
        return f" ({width}; did the last axis of an input change? If this is {transpose})"
    return f" ({width}; did the last axis of an input change?)"


def check_weight_in(params, key: str, width: int, *, input_name: str = "the input") -> tuple:
    """The shape ``(width, out)`` of the 2-D ``(in, out)`` weight ``params[key]``, checked on its
    input axis BEFORE a caller reads head counts or head widths off its output axis.

    A module that infers ``d`` from ``W.shape[1]`` and checks afterwards names a wrong expected shape
    for PyTorch's untransposed ``(out, in)`` weight (a ``(48, 24)`` ``q_proj`` read as ``d = 6``
    "must have shape (24, 24)"). Call this first: the message then says ``(24, out)`` and, where
    axis 1 is the input width, "pass its transpose, of shape (24, 48)" (and, since a ``(48, 24)``
    ``(in, out)`` weight meeting a widened 24-feature input reads the same, that reading too). A
    missing key is left to :func:`check_params` (it lists every missing key at once); ``()`` is
    returned then.
    """
    if not isinstance(params, dict) or params.get(key) is None:
        return ()
    shp = tuple(np.shape(params[key]))
    if len(shp) == 2 and shp[0] == width:
        return shp
    if len(shp) == 2 and shp[1] == width:  # the output width is unknown here: a wider input reads the same
        why = (f": if this is PyTorch's nn.Linear.weight (out, in), pass its transpose, of shape ({width}, {shp[0]}); "
               f"if it is already (in, out), axis 0 is the input width: this weight takes {shp[0]} features, so did "
               f"the last axis of an input change?")
    elif len(shp) == 2:
        why = (f" (axis 0 is the input width: this weight takes {shp[0]} features where {width} arrive; "
               f"did the last axis of an input change?)")
    else:
        why = " (a Linear weight is 2-D)"
    raise ValueError(f"{key} must have shape ({width}, out): refattn weights are (in, out) and {input_name} has "
                     f"{width} features; got {shp}{why}")


def cast_all(dt, d: dict) -> dict:
    """``{k: v.astype(dt)}`` for a dict of arrays (no copy where ``v`` already has dtype ``dt``)."""
    return {k: v.astype(dt, copy=False) for k, v in d.items()}
