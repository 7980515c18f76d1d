r"""Finite-difference verification of hand-derived backward passes.

Both checks differentiate the scalar $L(x) = \langle G, f(x)\rangle$ for a fixed random
upstream gradient $G$, so that ``backward(G, cache)`` must equal $\nabla_x L$.

* :func:`gradcheck` — central differences on *every entry* of every input and parameter
  (float64, tiny sizes). Error per argument is reported as
  ``max|analytic - numeric| / max(max|numeric|, max|analytic|, floor)`` — a norm-wise relative
  error that does not blow up on entries that happen to be near zero.
* :func:`directional_check` — one random direction $v$ through all arguments at once
  (larger sizes): $\langle \nabla L, v\rangle$ vs
  $(L(x+\varepsilon v) - L(x-\varepsilon v)) / 2\varepsilon$.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..registry import Mechanism, Sample, call_forward

__all__ = ["GradcheckError", "GradReport", "gradcheck", "directional_check"]


class GradcheckError(AssertionError):
    """Raised by the checks on failure; ``report`` holds the full table."""

    def __init__(self, report: GradReport):
        super().__init__("\n" + str(report))
        self.report = report


@dataclass
class GradReport:
    """Max abs/rel error per argument and the verdict."""

    kind: str
    rtol: float
    rows: list[tuple[str, tuple, float, float]] = field(default_factory=list)
    """(argument, shape, max abs error, relative error)"""

    @property
    def max_rel(self) -> float:
        return max((r[3] for r in self.rows), default=0.0)

    @property
    def passed(self) -> bool:
        return all(r[3] <= self.rtol for r in self.rows)

    def __str__(self) -> str:
        head = f"{self.kind}: {'PASS' if self.passed else 'FAIL'} (rtol {self.rtol:.1e})"
        lines = [head, f"  {'argument':<24}{'shape':<20}{'max abs err':>14}{'rel err':>12}  ok"]
        for name, shape, ab, rel in self.rows:
            ok = "yes" if rel <= self.rtol else "NO"
            lines.append(f"  {name:<24}{str(shape):<20}{ab:>14.3e}{rel:>12.3e}  {ok}")
        return "\n".join(lines)


def _split(sample: Sample, arrays: dict[str, np.ndarray]):
    inputs = {k: arrays[k] for k in sample.inputs}
    params = None if sample.params is None else {k: arrays[k] for k in sample.params}
    return inputs, params


def _as_float64(sample: Sample) -> dict[str, np.ndarray]:
    out = {}
    for k, v in sample.arrays().items():
        a = np.asarray(v)
        if a.dtype != np.float64:
            raise TypeError(f"finite-difference checks need float64 arrays; {k} is {a.dtype}")
        out[k] = a.copy()
    return out


def _forward_fn(forward, sample: Sample):
    rec = Mechanism(slug="_", family="1-softmax", tier="T1", title="_", forward=forward)

    def f(arrays):
        inputs, params = _split(sample, arrays)
        out, cache = call_forward(rec, inputs, params, sample.config)
        return out, cache

    return f


def _loss(f, arrays, G):
    out, _ = f(arrays)
    return float(np.sum(np.asarray(out, dtype=np.float64) * G))


def _analytic(f, backward, arrays, G, names):
    out, cache = f(arrays)
    grads = backward(G, cache)
    missing = [n for n in names if n not in grads]
    extra = [n for n in grads if n not in names]
    if missing or extra:
        raise GradcheckError(
            GradReport("gradient keys", 0.0, [(f"missing {missing} / extra {extra}", (), np.inf, np.inf)])
        )
    for n in names:
        if np.shape(grads[n]) != np.shape(arrays[n]):
            raise GradcheckError(
                GradReport("gradient shapes", 0.0, [(n, np.shape(grads[n]), np.inf, np.inf)])
            )
    return grads


def _upstream(f, arrays, rng):
    out, _ = f(arrays)
    return rng.standard_normal(np.shape(out))


def gradcheck(
    forward,
    backward,
    sample: Sample,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-6,
    floor: float = 1e-8,
    seed: int = 0,
    raise_on_failure: bool = True,
) -> GradReport:
    """Central-difference check of ``backward`` on every entry of every input and parameter.

    Parameters
    ----------
    forward, backward
        The mechanism's pair, following the record contract.
    sample
        A :class:`~refattn.registry.Sample` with float64 arrays (tiny sizes: cost is two
        forwards per entry).
    eps, rtol
        Step and the bound on the per-argument relative error.
    floor
        Denominator floor, so an all-zero gradient compares in absolute terms.

    Returns
    -------
    GradReport
        Raises :class:`GradcheckError` (with the table) on failure unless
        ``raise_on_failure=False``.
    """
    rng = np.random.default_rng(seed)
    arrays = _as_float64(sample)
    f = _forward_fn(forward, sample)
    G = _upstream(f, arrays, rng)
    names = list(arrays)
    grads = _analytic(f, backward, arrays, G, names)
    report = GradReport("gradcheck", rtol)
    # An argument whose gradient is structurally ~0 (e.g. a key bias) is compared against a
    # thousandth of the largest gradient instead of against itself.
    global_max = max((float(np.max(np.abs(grads[n]))) for n in names if np.size(grads[n])), default=0.0)
    floor = max(floor, 1e-3 * global_max)
    for n in names:
        x = arrays[n]
        num = np.zeros_like(x)
        flat = x.reshape(-1)  # a view: arrays are our own copies
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            lp = _loss(f, arrays, G)
            flat[i] = old - eps
            lm = _loss(f, arrays, G)
            flat[i] = old
            num.reshape(-1)[i] = (lp - lm) / (2 * eps)
        ana = np.asarray(grads[n], dtype=np.float64)
        ab = float(np.max(np.abs(ana - num))) if x.size else 0.0
        scale = max(float(np.max(np.abs(num))) if x.size else 0.0,
                    float(np.max(np.abs(ana))) if x.size else 0.0, floor)
        report.rows.append((n, x.shape, ab, ab / scale))
    if raise_on_failure and not report.passed:
        raise GradcheckError(report)
    return report


def directional_check(
    forward,
    backward,
    sample: Sample,
    *,
    eps: float = 1e-5,
    rtol: float = 1e-6,
    seed: int = 0,
    raise_on_failure: bool = True,
) -> GradReport:
    """Random-direction VJP-vs-JVP check: one forward pair for all arguments together.

    The reported error is ``|<grad, v> - fd| / max(|fd|, |<grad, v>|, sum|grad * v|,
    1e-4 (|L| + 1), 1e-3 sum_all|grad * v|)``, one row for the joint direction and one row per argument (direction
    restricted to that argument).
    """
    rng = np.random.default_rng(seed)
    arrays = _as_float64(sample)
    f = _forward_fn(forward, sample)
    G = _upstream(f, arrays, rng)
    names = list(arrays)
    grads = _analytic(f, backward, arrays, G, names)
    dirs = {n: rng.standard_normal(arrays[n].shape) for n in names}
    L0 = _loss(f, arrays, G)
    mag_all = float(sum(np.sum(np.abs(np.asarray(grads[n], dtype=np.float64) * dirs[n])) for n in names))
    report = GradReport("directional check", rtol)

    def one(label, active):
        plus = {n: (arrays[n] + eps * dirs[n] if n in active else arrays[n]) for n in names}
        minus = {n: (arrays[n] - eps * dirs[n] if n in active else arrays[n]) for n in names}
        fd = (_loss(f, plus, G) - _loss(f, minus, G)) / (2 * eps)
        prods = [np.asarray(grads[n], dtype=np.float64) * dirs[n] for n in active]
        an = float(sum(np.sum(p) for p in prods))
        # sum|g*v| is the dot product's magnitude without cancellation; the loss-relative floor
        # covers arguments whose gradient is structurally zero.
        mag = float(sum(np.sum(np.abs(p)) for p in prods))
        ab = abs(an - fd)
        # As in gradcheck: an argument whose gradient is structurally ~0 (a key bias) is compared
        # against a thousandth of the joint magnitude instead of against its own round-off.
        floor = max(1e-4 * (abs(L0) + 1.0), 1e-3 * mag_all)
        report.rows.append((label, (), ab, ab / max(abs(fd), abs(an), mag, floor)))

    one("<all arguments>", names)
    if len(names) > 1:
        for n in names:
            one(n, [n])
    if raise_on_failure and not report.passed:
        raise GradcheckError(report)
    return report
