"""Tolerances, ``assert_close`` and checking *other* implementations against refattn.

``compare_implementation`` is the entry point for engineers who write attention in PyTorch, JAX
or NumPy and want refattn's reference to judge it. Example with PyTorch (PyTorch is the user's
side here; refattn itself never imports it):

>>> import torch, torch.nn.functional as F
>>> from refattn.testing import compare_implementation
>>> def torch_sdpa(q, k, v, **config):
...     return F.scaled_dot_product_attention(q, k, v, is_causal=config.get("is_causal", False),
...                                           scale=config.get("scale"))
>>> def torch_vjp(dout, q, k, v, **config):
...     q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
...     out = torch_sdpa(q, k, v, **config)
...     dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
...     return {"q": dq, "k": dk, "v": dv}
>>> report = compare_implementation(torch_sdpa, "sdpa", vjp=torch_vjp, convert=torch.from_numpy,
...                                 config={"is_causal": True, "scale": None})
>>> report.passed    # print(report) shows the max abs / rel error of out, dq, dk, dv
True

Your function receives the sample's inputs and params as keyword arguments (converted by
``convert``) plus the config keywords, and returns the output in any array type NumPy can read
(``np.asarray``, DLPack or ``.detach().cpu().numpy()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..registry import Mechanism, Sample, call_forward, get

__all__ = ["tolerances", "assert_close", "to_numpy", "CompareReport", "compare_implementation"]

_TOL = {
    np.dtype(np.float64): (1e-10, 1e-12),
    np.dtype(np.float32): (2e-5, 1e-6),
    np.dtype(np.float16): (2e-3, 1e-4),
}


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


@dataclass
class CompareReport:
    """Per-output errors of an outside implementation against refattn."""

    slug: str
    rtol: float
    atol: float
    rows: list[tuple[str, tuple, float, float, bool]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r[4] for r in self.rows)

    def __str__(self) -> str:
        lines = [f"compare_implementation[{self.slug}]: {'PASS' if self.passed else 'FAIL'} "
                 f"(rtol {self.rtol:.1e}, atol {self.atol:.1e})",
                 f"  {'output':<16}{'shape':<22}{'max abs err':>14}{'max rel err':>14}  ok"]
        for name, shape, ab, rel, ok in self.rows:
            lines.append(f"  {name:<16}{str(shape):<22}{ab:>14.3e}{rel:>14.3e}  {'yes' if ok else 'NO'}")
        return "\n".join(lines)


def _row(name, got, ref, rtol, atol):
    got = to_numpy(got).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return (name, got.shape, np.inf, np.inf, False)
    err = np.abs(got - ref)
    ab = float(err.max()) if err.size else 0.0
    rel = ab / max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-300)
    ok = bool(np.all(err <= atol + rtol * np.abs(ref)))
    return (name, got.shape, ab, rel, ok)


def compare_implementation(
    fn,
    slug: str | Mechanism,
    *,
    vjp=None,
    sample: Sample | None = None,
    config: dict | None = None,
    size: str = "small",
    seed: int = 0,
    dtype=np.float64,
    convert=None,
    rtol: float | None = None,
    atol: float | None = None,
) -> CompareReport:
    """Check an outside implementation of mechanism ``slug`` against refattn's reference.

    Parameters
    ----------
    fn
        ``fn(**inputs, **params, **config) -> out``: your forward. Arrays arrive converted by
        ``convert`` (e.g. ``torch.from_numpy``; default: NumPy arrays).
    slug
        A registry slug (``refattn list``) or a :class:`~refattn.registry.Mechanism`.
    vjp
        Optional ``vjp(dout, **inputs, **params, **config) -> {name: grad}``: your backward.
        Every returned name is compared with refattn's hand-derived gradient.
    sample
        Arguments to use; default: the record's own sampler at ``size`` with ``seed``.
    config
        The configuration to compare under (e.g. ``{"is_causal": True}``). It *replaces* the
        sampler's own config, so your function sees exactly these keywords; the sampler's
        config (which may use refattn-only options such as soft-capping) is used only when
        ``config`` is None.
    dtype
        Cast inputs and params to this dtype before calling both implementations.
    rtol, atol
        Default: :func:`tolerances` of ``dtype``.

    Returns
    -------
    CompareReport
        ``.passed`` and a printable table; it does not raise.
    """
    rec = slug if isinstance(slug, Mechanism) else get(slug)
    if not rec.implemented:
        raise ValueError(f"mechanism {rec.slug!r} is not implemented in refattn yet")
    if sample is None:
        sample = rec.sample(np.random.default_rng(seed), size)
    cfg = dict(sample.config) if config is None else dict(config)
    inputs = {k: np.asarray(v, dtype=dtype) for k, v in sample.inputs.items()}
    params = None if sample.params is None else {k: np.asarray(v, dtype=dtype) for k, v in sample.params.items()}
    r0, a0 = tolerances(dtype)
    rtol = r0 * 10 if rtol is None else rtol
    atol = a0 * 10 if atol is None else atol
    report = CompareReport(rec.slug, rtol, atol)

    ref_out, cache = call_forward(rec, inputs, params, cfg)
    conv = convert if convert is not None else (lambda a: a)
    kw = {k: conv(v.copy()) for k, v in inputs.items()}
    kw.update({k: conv(v.copy()) for k, v in (params or {}).items()})
    got = fn(**kw, **cfg)
    report.rows.append(_row("out", got, ref_out, rtol, atol))

    if vjp is not None:
        g = np.random.default_rng(seed + 1).standard_normal(np.shape(ref_out)).astype(dtype)
        ref_grads = rec.backward(g, cache)
        kw = {k: conv(v.copy()) for k, v in inputs.items()}
        kw.update({k: conv(v.copy()) for k, v in (params or {}).items()})
        theirs = vjp(conv(g.copy()), **kw, **cfg)
        for name, val in theirs.items():
            if name not in ref_grads:
                report.rows.append((f"d{name} (unknown)", (), np.inf, np.inf, False))
                continue
            report.rows.append(_row(f"d{name}", val, ref_grads[name], rtol, atol))
    return report
