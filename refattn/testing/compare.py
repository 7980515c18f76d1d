"""Tolerances, ``assert_close`` and checking *other* implementations against refattn.

``compare_implementation`` is the entry point for engineers who write attention in PyTorch, JAX
or NumPy and want refattn's reference to judge it. Example with PyTorch (PyTorch is the user's
side here; refattn itself never imports it):

>>> import torch, torch.nn.functional as F
>>> from refattn.testing import compare_implementation
>>> def torch_sdpa(q, k, v, attn_mask=None, is_causal=False, **config):
...     if is_causal:  # PyTorch's is_causal cannot be combined with a mask: build it (top-left)
...         causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
...         attn_mask = causal if attn_mask is None else attn_mask & causal
...     return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
>>> def torch_vjp(dout, q, k, v, **config):
...     q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
...     out = torch_sdpa(q, k, v, **config)
...     dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
...     return {"q": dq, "k": dk, "v": dv}
>>> report = compare_implementation(torch_sdpa, "sdpa", vjp=torch_vjp, convert=torch.from_numpy,
...                                 config={"is_causal": True})
>>> report.passed    # print(report): the cases run, a per-array table, the worst entries
True

Your function receives the case's inputs, params and config as keyword arguments (every array
converted by ``convert``, masks included) and returns the output in any array type NumPy can read
(``np.asarray``, DLPack or ``.detach().cpu().numpy()``).

What is compared
----------------
* **A battery of cases, at several seeds.** Each record names its cases (``Mechanism.cases``;
  the softmax family's are in :mod:`refattn.testing.cases`: the sampler's own draw, ``N < M``,
  ``N > M``, one decoding query, grouped kv heads, odd sizes, a fully masked row); a record
  without cases runs its sampler at both sizes. ``cases=`` and ``seeds=`` choose; ``sample=``
  compares one given sample.
* **The output and every gradient.** Given a ``vjp``, every differentiable input and parameter
  of the record must come back; a missing one fails the check. ``grads=`` restricts the
  comparison to the names given, and the report lists the rest as not compared.
* **Tolerance from the dtype your function returns** (per array):

  ``float64``: every entry within ``atol + rtol |ref|``, ``rtol = 1e-9``, ``atol = 1e-11``.

  ``float32``, ``float16``, ``bfloat16``: the FlashAttention acceptance rule, the one refattn's own
  kernels meet. The error of your array against refattn's float64 result may be at most twice the
  error of refattn's own computation at that precision (inputs rounded to it, the naive
  formula), in root-mean-square, and four times it in the max::

      rms(err) <= 2 rms(err_naive) + eps rms(ref),   max|err| <= 4 max|err_naive| + 4 eps max|ref|

  ``eps`` is the dtype's machine epsilon (a floor for arrays the naive formula gets exactly).

  Explicit ``rtol``/``atol`` replace the rule by an entry-wise bound for every array.

``print(report)`` shows the cases run and skipped, a per-array table (runs passed, max abs and
relative error, the worst run and entry with both values), and for each failing run the shapes, the
config, how many entries are off and the max error per position along axis -2 (queries for the
output): a wrong scale is off everywhere, an off-by-one mask only in some rows.
"""

from __future__ import annotations

import math
import unittest
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..registry import CaseNotApplicable, Mechanism, Sample, UnknownMechanism, call_forward, get

__all__ = ["tolerances", "assert_close", "to_numpy", "CompareReport", "CaseResult", "ArrayResult",
           "CompareCase", "compare_implementation", "compare_cases", "DEFAULT_SEEDS", "battery"]

DEFAULT_SEEDS = (0, 1, 2)

_TOL = {
    np.dtype(np.float64): (1e-10, 1e-12),
    np.dtype(np.float32): (2e-5, 1e-6),
    np.dtype(np.float16): (2e-3, 1e-4),
}

# float64 results are compared entry-wise at these (10x tolerances(float64): another library's
# summation order and BLAS differ from NumPy's).
F64_RTOL, F64_ATOL = 1e-9, 1e-11
_EPS = {"float32": float(np.finfo(np.float32).eps), "float16": float(np.finfo(np.float16).eps),
        "bfloat16": 2.0 ** -7}


def tolerances(dtype) -> tuple[float, float]:
    """Default ``(rtol, atol)`` for comparing results computed in ``dtype``."""
    return _TOL.get(np.dtype(dtype), (2e-5, 1e-6))


def to_numpy(x) -> np.ndarray:
    """An array from NumPy, PyTorch (any device), JAX, CuPy … via ``__array__`` or DLPack."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # torch: drop the autograd graph, move to host
        x = x.detach()
        if hasattr(x, "cpu"):
            x = x.cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()
    try:
        return np.asarray(x)
    except Exception:
        return np.from_dlpack(x)


def assert_close(actual, desired, *, rtol: float | None = None, atol: float | None = None,
                 dtype=None, name: str = "value") -> None:
    """Assert ``|actual - desired| <= atol + rtol |desired|`` elementwise.

    Default tolerances follow the lower precision of ``dtype`` (or of the two arrays):
    float64 1e-10/1e-12, float32 2e-5/1e-6, float16 2e-3/1e-4. The message reports the worst
    entry, its index and the max abs/rel error.
    """
    a = to_numpy(actual)
    d = to_numpy(desired)
    if a.shape != d.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {d.shape}")
    if dtype is None:
        cands = [x.dtype for x in (a, d) if x.dtype.kind == "f"]
        dtype = min(cands, key=lambda t: t.itemsize) if cands else np.float64
    r0, a0 = tolerances(dtype)
    rtol = r0 if rtol is None else rtol
    atol = a0 if atol is None else atol
    a64 = a.astype(np.float64)
    d64 = d.astype(np.float64)
    same_nonfinite = (~np.isfinite(d64)) & (a64 == d64)
    err = np.where(same_nonfinite, 0.0, np.abs(a64 - d64))
    bound = atol + rtol * np.abs(np.where(np.isfinite(d64), d64, 0.0))
    bad = ~(err <= bound)
    if bad.any():
        idx = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), err.shape)
        rel = err / np.maximum(np.abs(d64), 1e-300)
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {err.size} entries differ (rtol {rtol:.1e}, atol {atol:.1e}); "
            f"worst at {tuple(int(i) for i in idx)}: got {a64[idx]!r}, expected {d64[idx]!r}; "
            f"max abs err {np.nanmax(err):.3e}, max rel err {np.nanmax(np.where(np.isfinite(rel), rel, 0)):.3e}"
        )


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class ArrayResult:
    """One array (the output or one gradient) of one run, against refattn."""

    name: str
    expected_shape: tuple
    shape: tuple | None = None
    """What the implementation returned (None: it returned nothing under this name)."""
    precision: str = ""
    ok: bool = False
    max_abs: float = math.nan
    max_rel: float = math.nan
    """Max abs error divided by the array's largest reference entry."""
    bad: int = 0
    """Entries beyond the entry-wise bound (for the float32 rule: beyond its max bound)."""
    size: int = 0
    index: tuple | None = None
    got: float = math.nan
    expected: float = math.nan
    row_errors: list[float] | None = None
    """Max abs error per position along axis -2 (query rows of an attention output)."""
    note: str = ""

    def describe(self) -> str:
        if self.shape is None:
            return self.note
        if self.shape != self.expected_shape:
            return f"shape {self.shape}, expected {self.expected_shape}"
        if self.ok:
            return f"ok (max abs err {self.max_abs:.2e})"
        head = f"{self.bad} of {self.size} entries off" if self.bad else self.note or "off"
        text = (f"{head}; worst at {self.index}: got {_num(self.got)}, expected {_num(self.expected)} "
                f"(abs err {self.max_abs:.2e}, {_rel(self.max_rel)})")
        if self.note and self.bad:
            text += f"; {self.note}"
        return text


@dataclass
class CaseResult:
    """One case at one seed: the shapes and config it ran with and every array compared."""

    case: str
    seed: int | None
    shapes: str
    config: str
    arrays: list[ArrayResult] = field(default_factory=list)
    error: str = ""
    """An exception your function or VJP raised on this case (the run fails)."""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.arrays) and all(a.ok for a in self.arrays)

    @property
    def label(self) -> str:
        return self.case if self.seed is None else f"{self.case} seed {self.seed}"


@dataclass
class CompareReport:
    """Every run of an outside implementation against refattn; ``passed`` and a printable report."""

    slug: str
    results: list[CaseResult] = field(default_factory=list)
    skipped_cases: list[tuple[str, str]] = field(default_factory=list)
    """(case, reason) for the cases that do not exist under the config compared."""
    grads_compared: list[str] = field(default_factory=list)
    grads_skipped: list[str] = field(default_factory=list)
    """Gradients left out by ``grads=`` (listed, never silently dropped)."""
    vjp_given: bool = False
    rules: dict[str, str] = field(default_factory=dict)
    """precision -> the tolerance rule applied to arrays of that precision."""

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.ok]

    def worst(self, name: str | None = None) -> tuple[CaseResult, ArrayResult] | None:
        """The run and array with the largest relative error (optionally for one array name)."""
        best = None
        for r in self.results:
            for a in r.arrays:
                if name is not None and a.name != name:
                    continue
                score = _badness(a)
                if best is None or score > best[0]:
                    best = (score, r, a)
        return None if best is None else (best[1], best[2])

    def __str__(self) -> str:
        n_fail = len(self.failures)
        cases = list(dict.fromkeys(r.case for r in self.results))
        seeds = sorted({r.seed for r in self.results if r.seed is not None})
        what = f"{len(cases)} cases x seeds {', '.join(map(str, seeds))}" if seeds else f"{len(cases)} case"
        if self.passed:
            head = f"compare_implementation[{self.slug}]: PASS ({len(self.results)} runs: {what})"
        else:
            head = (f"compare_implementation[{self.slug}]: FAIL: {n_fail} of {len(self.results)} runs fail "
                    f"({what})")
        lines = [head]
        if not self.results:
            lines.append("  no case ran")
        lines.append(f"  cases: {', '.join(cases) or '-'}")
        if self.skipped_cases:
            lines.append("  skipped cases: " + "; ".join(f"{c} ({why})" for c, why in self.skipped_cases))
        if not self.vjp_given:
            lines.append("  gradients: not compared (no vjp given)")
        else:
            g = f"  gradients compared: {', '.join(self.grads_compared) or 'none'}"
            if self.grads_skipped:
                g += f"; NOT compared (grads=): {', '.join(self.grads_skipped)}"
            lines.append(g)
        for prec, rule in self.rules.items():
            lines.append(f"  tolerance ({prec}): {rule}")
        table = self._table()
        if table:
            lines.append("")
            lines += ["  " + t for t in table]
        fails = self.failures
        if fails:
            # the first failing run of each case (a bug usually shows in some cases and not others)
            shown = list({r.case: r for r in reversed(fails)}.values())[::-1][:8]
            lines.append("")
            more = len(fails) - len(shown)
            lines.append("  failures (first failing run of each case" + (f"; {more} more in report.failures" if more
                                                                          else "") + "):")
            for r in shown:
                lines.append(f"    {r.label}: {r.shapes}" + (f"; {r.config}" if r.config else ""))
                if r.error:
                    lines.append(f"      raised {r.error}")
                width = max((len(a.name) for a in r.arrays), default=0)
                for a in r.arrays:
                    if a.ok:
                        continue
                    lines.append(f"      {a.name:<{width}}  {a.describe()}")
                    if a.row_errors is not None:
                        lines.append(f"      {'':<{width}}  max |err| per row (axis -2): "
                                     + " ".join(_short(e) for e in a.row_errors))
        return "\n".join(lines)

    def _table(self) -> list[str]:
        names = list(dict.fromkeys(a.name for r in self.results for a in r.arrays))
        if not names:
            return []
        rows = [["array", "runs ok", "max abs err", "rel err", "worst run", "worst entry", "got", "expected"]]
        for name in names:
            arrs = [(r, a) for r in self.results for a in r.arrays if a.name == name]
            n_ok = sum(a.ok for _, a in arrs)
            r, a = self.worst(name)
            if a.shape is None:
                stats = ["missing", "-", r.label, "-", "-", "-"]
            elif a.shape != a.expected_shape:
                stats = ["shape", "-", r.label, f"{a.shape}", "-", f"{a.expected_shape}"]
            else:
                stats = [f"{a.max_abs:.2e}", "ref is 0" if math.isinf(a.max_rel) else f"{a.max_rel:.2e}", r.label,
                         str(a.index), _num(a.got), _num(a.expected)]
            rows.append([name, f"{n_ok}/{len(arrs)}", *stats])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _num(x: float) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _rel(x: float) -> str:
    return "refattn's array is 0" if math.isinf(x) else f"{x:.2e} of max|ref|"


def _short(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _badness(a: ArrayResult) -> float:
    if a.shape is None or a.shape != a.expected_shape:
        return math.inf
    if math.isnan(a.max_rel):
        return math.inf
    return a.max_rel + (1e300 if not a.ok else 0.0)


# --------------------------------------------------------------------------------------------
# Comparing one array


def _precision_of(x) -> str:
    """'float64' | 'float32' | 'float16' | 'bfloat16' for what an implementation returned."""
    s = str(getattr(x, "dtype", ""))
    if "bfloat16" in s:
        return "bfloat16"
    for p in ("float16", "float32", "float64"):
        if s.endswith(p):
            return p
    return str(to_numpy(x).dtype)


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (nearest-even) and return float32 holding the rounded values."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def _round_to(a: np.ndarray, precision: str) -> np.ndarray:
    if precision == "bfloat16":
        return _round_bf16(a)
    return np.asarray(a).astype(precision)


def _entrywise(precision: str, rtol, atol) -> tuple[float, float]:
    """The entry-wise ``(rtol, atol)``: the caller's, the float64 rule's, else tolerances(precision)."""
    r0, a0 = (F64_RTOL, F64_ATOL) if precision == "float64" else tolerances(
        np.float32 if precision == "bfloat16" else precision)
    return (r0 if rtol is None else rtol), (a0 if atol is None else atol)


def _rule_text(precision: str, rtol, atol) -> str:
    if rtol is not None or atol is not None:
        r, t = _entrywise(precision, rtol, atol)
        return f"|err| <= {t:.1e} + {r:.1e} |ref| per entry (your rtol/atol)"
    if precision == "float64":
        return f"|err| <= {F64_ATOL:.0e} + {F64_RTOL:.0e} |ref| per entry"
    return (f"rms(err) <= 2 rms(err_naive) + eps S and max|err| <= 4 max|err_naive| + 4 eps S, "
            f"err_naive = refattn computed in {precision}, eps = {_EPS[precision]:.2e}, "
            f"S = largest |entry| of refattn's output and gradients in the run")


def _compare_array(name, got, ref, *, precision, naive=None, rtol=None, atol=None, run_scale=0.0) -> ArrayResult:
    ref = np.asarray(ref, dtype=np.float64)
    res = ArrayResult(name, tuple(ref.shape), precision=precision)
    a = to_numpy(got)
    res.shape = tuple(a.shape)
    if res.shape != res.expected_shape:
        res.note = "wrong shape"
        return res
    a = a.astype(np.float64)
    res.size = a.size
    same = (a == ref) | (np.isnan(a) & np.isnan(ref))
    err = np.where(same, 0.0, np.abs(a - ref))
    err = np.where(np.isnan(err), np.inf, err)
    scale = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0))
    if err.size:
        flat = int(np.argmax(err))
        idx = np.unravel_index(flat, err.shape)
        res.index = tuple(int(i) for i in idx)
        res.got, res.expected = float(a[idx]), float(ref[idx])
        res.max_abs = float(err[idx])
    else:
        res.max_abs = 0.0
    res.max_rel = res.max_abs / scale if scale > 0 else (0.0 if res.max_abs == 0 else math.inf)
    if rtol is not None or atol is not None or precision == "float64" or naive is None:
        r, t = _entrywise(precision, rtol, atol)
        bad = ~(err <= t + r * np.abs(np.where(np.isfinite(ref), ref, 0.0)))
        res.bad = int(bad.sum())
        res.ok = res.bad == 0
    else:
        eps = _EPS[precision]
        fin = np.isfinite(ref)
        n_err = np.abs(np.asarray(naive, np.float64) - ref)
        n_err = np.where(fin, n_err, 0.0)
        rms = lambda e: float(np.sqrt(np.mean(e[fin] ** 2))) if fin.any() else 0.0  # noqa: E731
        floor = eps * max(scale, run_scale)
        max_bound = 4 * float(np.max(n_err, initial=0.0)) + 4 * floor
        rms_bound = 2 * rms(n_err) + floor
        res.bad = int((err > max_bound).sum())
        rms_err = rms(err) if np.isfinite(err).all() else math.inf
        res.ok = res.bad == 0 and rms_err <= rms_bound
        if not res.ok:
            res.note = (f"rms err {rms_err:.2e} vs bound {rms_bound:.2e}, max err {res.max_abs:.2e} vs bound "
                        f"{max_bound:.2e} (refattn in {precision}: rms {rms(n_err):.2e}, max {np.max(n_err, initial=0):.2e})")
    if not res.ok and a.ndim >= 2 and a.shape[-2] <= 32:
        rows = np.moveaxis(err, -2, 0).reshape(a.shape[-2], -1)
        res.row_errors = [float(x) for x in rows.max(axis=1)]
    return res


# --------------------------------------------------------------------------------------------
# The battery


def battery(rec: Mechanism) -> dict:
    """The named cases ``compare_implementation`` runs for ``rec``: its ``cases``, or the default
    battery of its sampler at both sizes (a caller's config replaces the sampler's)."""
    if rec.cases:
        return dict(rec.cases)

    def sized(size):
        def build(rng, config=None):
            s = rec.sample(rng, size)
            return s if config is None else Sample(s.inputs, s.params, dict(config))
        build.__doc__ = f"{rec.slug} default compare case: the record's sampler at {size!r}"
        return build

    return {"tiny": sized("tiny"), "small": sized("small")}


def _record(slug) -> Mechanism:
    if isinstance(slug, Mechanism):
        rec = slug
    else:
        if not isinstance(slug, str):
            raise TypeError(f"slug must be a registry slug (str) or a Mechanism; got {type(slug).__name__}")
        try:
            rec = get(slug)
        except UnknownMechanism as exc:
            raise ValueError(f"compare_implementation: {exc}") from None
    if not rec.implemented:
        raise ValueError(f"mechanism {rec.slug!r} is not implemented in refattn yet")
    return rec


def _summary(v) -> str:
    """A config value in a few characters: arrays by dtype and shape, at any nesting depth."""
    if isinstance(v, np.ndarray) or hasattr(v, "__array__") and hasattr(v, "shape"):
        return f"<{getattr(v, 'dtype', '')} {tuple(v.shape)}>"
    if isinstance(v, (tuple, list)):
        inner = ", ".join(_summary(x) for x in v)
        return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _short_config(cfg: dict) -> str:
    return ", ".join(f"{k}={_summary(v)}" for k, v in cfg.items())


def _shapes(arrays: dict) -> str:
    return ", ".join(f"{k} {tuple(np.shape(v))}" for k, v in arrays.items())


def _check_output_type(got, what: str, expected_shape) -> None:
    """Bad use: anything but one floating array raises ``TypeError`` naming what was expected."""
    exp = f"one floating-point array (NumPy, torch, JAX ...) of shape {tuple(expected_shape)}"
    if got is None or isinstance(got, (tuple, list, dict, str, bytes, Mapping)):
        given = type(got).__name__
        if isinstance(got, (tuple, list)):
            given += f" of {len(got)} (if it returns (out, extras), compare lambda **kw: fn(**kw)[0])"
        raise TypeError(f"{what} must return {exp}; got {given}")
    try:
        arr = to_numpy(got)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"{what} must return {exp}; got {type(got).__name__}, which NumPy cannot read ({exc})") from None
    if arr.dtype.kind != "f" and "bfloat16" not in str(arr.dtype):
        raise TypeError(f"{what} must return {exp}; got an array of dtype {arr.dtype}")


def compare_implementation(
    fn,
    slug: str | Mechanism,
    *,
    vjp=None,
    config: dict | None = None,
    cases: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    grads: Sequence[str] | None = None,
    sample: Sample | None = None,
    dtype=np.float64,
    convert=None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int | None = None,
) -> CompareReport:
    """Check an outside implementation of mechanism ``slug`` against refattn's reference.

    Parameters
    ----------
    fn
        ``fn(**inputs, **params, **config) -> out``: your forward. Every array arrives converted
        by ``convert`` (e.g. ``torch.from_numpy``; default: NumPy arrays), masks included.
    slug
        A registry slug (``refattn list``) or a :class:`~refattn.registry.Mechanism`.
    vjp
        ``vjp(dout, **inputs, **params, **config) -> {name: grad}``: your backward. It must return
        a gradient for every differentiable input and parameter of the record (a missing one fails
        the check). ``dout`` has the dtype of your output.
    config
        The configuration to compare under (e.g. ``{"is_causal": True}``): it replaces the
        sampler's options, so your function sees these keywords plus only the data a case adds (a
        masked-row case's ``attn_mask``). None: the record's own sampler configuration, which may
        use refattn-only options (soft-capping).
    cases, seeds
        Which cases of the record's battery (default: all; names as in the report) at which
        seeds (default ``(0, 1, 2)``). ``seed=`` is ``seeds=(seed,)``.
    grads
        Compare only these gradients (names as in the vjp's dict); the report lists the others as
        not compared.
    sample
        Compare this one sample instead of the battery (its config, unless ``config`` is given).
    dtype
        Cast the sample's inputs and params to this dtype before calling both implementations.
    rtol, atol
        Replace the dtype rule (see the module docstring) by an entry-wise bound.

    Returns
    -------
    CompareReport
        ``.passed`` and a printable report. Failures of your function (wrong values, a missing
        gradient, an exception it raises) are reported, not raised.

    Raises
    ------
    ValueError
        An unknown or unimplemented slug, an unknown case or gradient name, a sample or config
        that refattn's reference rejects (the message says what it expected), or no case that
        exists under ``config``.
    TypeError
        ``fn`` returns something other than one floating array, or ``vjp`` something other than a
        dict of arrays.
    """
    report = _compare(fn, slug, vjp=vjp, config=config, cases=cases, seeds=seeds, grads=grads, sample=sample,
                      dtype=dtype, convert=convert, rtol=rtol, atol=atol, seed=seed)
    if not report.results:
        why = "; ".join(f"{c}: {r}" for c, r in report.skipped_cases)
        raise ValueError(f"compare_implementation[{report.slug}]: no case exists under this config ({why})")
    return report


def _compare(fn, slug, *, vjp, config, cases, seeds, grads, sample, dtype, convert, rtol, atol, seed):
    rec = _record(slug)
    if not callable(fn):
        raise TypeError(f"fn must be your forward function; got {type(fn).__name__}")
    if vjp is not None and not callable(vjp):
        raise TypeError(f"vjp must be your backward function or None; got {type(vjp).__name__}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict of keyword arguments; got {type(config).__name__}")
    if seed is not None:
        if seeds is not None:
            raise ValueError("give seeds= or seed=, not both")
        seeds = (seed,)
    seeds = tuple(DEFAULT_SEEDS if seeds is None else seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if sample is not None:
        if cases is not None:
            raise ValueError("give sample= or cases=, not both")
        if not isinstance(sample, Sample):
            raise TypeError(f"sample must be a refattn.registry.Sample; got {type(sample).__name__}")
        plan = [("given", None, lambda rng, cfg: sample if cfg is None else Sample(sample.inputs, sample.params,
                                                                                   dict(cfg)))]
    else:
        avail = battery(rec)
        names = list(avail) if cases is None else [cases] if isinstance(cases, str) else list(cases)
        unknown = [c for c in names if c not in avail]
        if unknown or not names:
            raise ValueError(f"{rec.slug} has no compare case {unknown or names}; its cases are {list(avail)}")
        plan = [(c, s, avail[c]) for c in names for s in seeds]
    conv = convert if convert is not None else (lambda a: a)
    dtype = np.dtype(dtype)
    report = CompareReport(rec.slug, vjp_given=vjp is not None)
    skipped = {}
    for case, s, build in plan:
        if case in skipped:
            continue
        rng = np.random.default_rng(0 if s is None else s)
        try:
            smp = build(rng, None if config is None else dict(config))
        except CaseNotApplicable as exc:
            skipped[case] = str(exc)
            continue
        result = _run_case(rec, fn, vjp, smp, case, s, dtype, conv, grads, rtol, atol, report)
        report.results.append(result)
    report.skipped_cases = list(skipped.items())
    return report


def _cast(d: dict | None, dtype) -> dict | None:
    if d is None:
        return None
    return {k: np.asarray(v).astype(dtype) for k, v in d.items()}


def _run_case(rec, fn, vjp, smp: Sample, case, seed, dtype, conv, grads, rtol, atol, report) -> CaseResult:
    inputs, params, cfg = _cast(smp.inputs, dtype), _cast(smp.params, dtype), dict(smp.config)
    result = CaseResult(case, seed, _shapes({**inputs, **(params or {})}), _short_config(cfg))
    label = f"compare_implementation[{rec.slug}] case {result.label}"
    in64, par64 = _cast(inputs, np.float64), _cast(params, np.float64)
    try:
        ref_out, cache = call_forward(rec, in64, par64, cfg)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{label}: refattn's reference rejects these arguments ({result.shapes}; "
                         f"{result.config}): {exc}") from None

    def kwargs():
        kw = {k: conv(v.copy()) for k, v in inputs.items()}
        kw.update({k: conv(v.copy()) for k, v in (params or {}).items()})
        kw.update({k: conv(v.copy()) if isinstance(v, np.ndarray) else v for k, v in cfg.items()})
        return kw

    try:
        got = fn(**kwargs())
    except Exception as exc:  # noqa: BLE001 - reported as the run's failure
        result.error = f"{type(exc).__name__} in your function: {exc}"
        return result
    _check_output_type(got, "fn", np.shape(ref_out))
    prec = _precision_of(got)
    naive_cache = {}

    def naive(precision):
        if precision not in naive_cache:
            low = "float32" if precision == "float64" else precision
            n_in = {k: _round_to(v, low).astype(np.float32 if low == "bfloat16" else low) for k, v in in64.items()}
            n_par = None if par64 is None else {k: _round_to(v, low).astype(np.float32 if low == "bfloat16" else low)
                                                for k, v in par64.items()}
            out, c = call_forward(rec, n_in, n_par, cfg)
            naive_cache[precision] = (_round_to(out, precision) if precision != "float32" else out, c)
        return naive_cache[precision]

    # (name, got or None if missing, ref, precision, naive): compared at the end, when the scale
    # of the whole run (output and every gradient) is known
    pending = []

    def finish():
        run_scale = max((float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)) for _, _, r, _, _ in pending),
                        default=0.0)
        for name, got_arr, ref_arr, precision, naive_arr in pending:
            if got_arr is None:
                result.arrays.append(ArrayResult(name, tuple(np.shape(ref_arr)),
                                                 note=f"missing: your vjp returned no {name[5:]!r}"))
                continue
            if precision not in report.rules:
                report.rules[precision] = _rule_text(precision, rtol, atol)
            result.arrays.append(_compare_array(name, got_arr, ref_arr, precision=precision, naive=naive_arr,
                                                rtol=rtol, atol=atol, run_scale=run_scale))
        return result

    low = prec != "float64" and rtol is None and atol is None
    ref_out = np.asarray(ref_out, dtype=np.float64)
    pending.append(("out", got, ref_out, prec, naive(prec)[0] if low else None))
    if vjp is None:
        return finish()

    out_np = to_numpy(got)
    g_dtype = out_np.dtype if out_np.dtype.kind == "f" else np.dtype(np.float32)
    dout = np.random.default_rng([0 if seed is None else seed, 1]).standard_normal(np.shape(ref_out)).astype(g_dtype)
    if prec == "bfloat16":  # NumPy has no bfloat16: float32 holding bfloat16 values (cast it in your vjp)
        dout = _round_bf16(dout)
    ref_grads = rec.backward(dout.astype(np.float64), cache)
    names = list(ref_grads)
    if grads is not None:
        want = [grads] if isinstance(grads, str) else list(grads)
        unknown = [g for g in want if g not in names]
        if unknown:
            raise ValueError(f"grads names {unknown} that {rec.slug} does not have; its gradients are {names}")
        report.grads_skipped = [g for g in names if g not in want]
        names = [g for g in names if g in want]
    report.grads_compared = names
    try:
        theirs = vjp(conv(dout.copy()), **kwargs())
    except Exception as exc:  # noqa: BLE001
        result.error = f"{type(exc).__name__} in your vjp: {exc}"
        return finish()
    if not isinstance(theirs, Mapping):
        raise TypeError(f"vjp must return a dict {{name: gradient}} with the names {list(ref_grads)}; "
                        f"got {type(theirs).__name__}")
    extra = [k for k in theirs if k not in ref_grads]
    if extra:
        raise ValueError(f"vjp returned gradients {extra} that {rec.slug} does not have; its gradients are "
                         f"{list(ref_grads)} (the forward's input and params names)")
    naive_grads = {}
    for name in names:
        ref_g = np.asarray(ref_grads[name], dtype=np.float64)
        if name not in theirs or theirs[name] is None:
            pending.append((f"grad {name}", None, ref_g, "", None))
            continue
        _check_output_type(theirs[name], f"vjp (gradient {name!r})", np.shape(ref_g))
        gp = _precision_of(theirs[name])
        n_arr = None
        if gp != "float64" and rtol is None and atol is None:
            if gp not in naive_grads:
                n_out, n_cache = naive(gp)
                naive_grads[gp] = rec.backward(dout.astype(np.float32), n_cache)
            n_arr = np.asarray(naive_grads[gp][name])
            if gp != "float32":
                n_arr = _round_to(n_arr, gp)
        pending.append((f"grad {name}", theirs[name], ref_g, gp, n_arr))
    return finish()


# --------------------------------------------------------------------------------------------
# Test suites


@dataclass(frozen=True)
class CompareCase:
    """One (slug, case, seed) of a battery, for ``pytest.mark.parametrize``; ``str`` is its id."""

    slug: str
    case: str
    seed: int

    def __str__(self) -> str:
        return f"{self.slug}-{self.case}-{self.seed}"

    def check(self, fn, **kwargs) -> CompareReport:
        """``compare_implementation`` on this one case and seed: returns the report when it passes,
        raises ``AssertionError`` with the printed report when it fails, and
        ``unittest.SkipTest`` (a skip under pytest) when the case does not exist under ``config``."""
        report = _compare(fn, self.slug, cases=[self.case], seeds=[self.seed], **_defaults(kwargs))
        if not report.results:
            raise unittest.SkipTest(f"{self}: " + "; ".join(r for _, r in report.skipped_cases))
        if not report.passed:
            raise AssertionError("\n" + str(report))
        return report


def _defaults(kwargs):
    out = dict(vjp=None, config=None, grads=None, sample=None, dtype=np.float64, convert=None, rtol=None, atol=None,
               seed=None)
    unknown = set(kwargs) - set(out)
    if unknown:
        raise TypeError(f"CompareCase.check got unexpected keywords {sorted(unknown)}")
    out.update(kwargs)
    return out


def compare_cases(*slugs: str, cases: Sequence[str] | None = None,
                  seeds: Sequence[int] = DEFAULT_SEEDS) -> list[CompareCase]:
    """Every (slug, case, seed) of the given slugs' batteries, for one-line parametrisation::

        @pytest.mark.parametrize("case", compare_cases("sdpa", "gqa_mqa"), ids=str)
        def test_my_attention(case):
            case.check(MY_IMPLS[case.slug], vjp=MY_VJPS[case.slug], convert=torch.from_numpy)

    ``cases`` keeps only those names (each must exist in at least one slug's battery)."""
    if not slugs:
        raise ValueError("compare_cases needs at least one slug")
    out, seen = [], set()
    for slug in slugs:
        rec = _record(slug)
        names = list(battery(rec))
        if cases is not None:
            seen.update(c for c in cases if c in names)
            names = [c for c in names if c in cases]
        out += [CompareCase(rec.slug, c, int(s)) for c in names for s in seeds]
    missing = [c for c in (cases or ()) if c not in seen]
    if missing:
        raise ValueError(f"no slug among {list(slugs)} has the cases {missing}")
    return out
