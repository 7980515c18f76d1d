"""Robustness over the whole registry (issue: bad input, properties, stress, inputs never modified).

Every implemented record is swept automatically; a mechanism added later is covered without new
test code.

Bad-input sweep. Each case must either work correctly or raise ``ValueError``/``TypeError`` whose
message names an argument. A NumPy/Numba-internal error (IndexError, a broadcasting ValueError
that names no argument, a ZeroDivisionError …) fails the case.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refattn import registry
from refattn.registry import Sample, call_forward

IMPLEMENTED = registry.all(implemented=True)
IDS = [r.slug for r in IMPLEMENTED]


def _with_backend(rec, backend):
    """The record run through a kernel backend: same sampler, plus ``backend=`` in the config."""
    def sample(rng, size):
        s = rec.sample(rng, size)
        return Sample(s.inputs, s.params, dict(s.config, backend=backend))
    return dataclasses.replace(rec, sample=sample, slug=f"{rec.slug}[{backend}]")


# Kernel entry points reached through the reference functions' ``backend`` keyword are swept too
# (the CUDA backend is swept by tests/cuda, under the simulator, at its own sizes).
KERNEL_VARIANTS = [_with_backend(r, "numba") for r in IMPLEMENTED
                   if "backend" in inspect.signature(r.forward).parameters]
SWEPT = IMPLEMENTED + KERNEL_VARIANTS
SWEPT_IDS = [r.slug for r in SWEPT]
# Forward-only records (differentiable=False) are swept for bad input but have no backward.
SWEPT_DIFF = [r for r in SWEPT if r.differentiable]
SWEPT_DIFF_IDS = [r.slug for r in SWEPT_DIFF]
_COUNT = {"cases": 0}

_INTERNAL_MARKERS = ("operands could not be broadcast", "index ", "out of bounds", "axis ", "shapes (",
                     "matmul: ", "cannot reshape", "zero-size array")


def _names(rec, s: Sample) -> list[str]:
    names = list(s.inputs) + list((s.params or {}).keys()) + list(s.config.keys()) + ["params", "dout"]
    try:
        names += list(inspect.signature(rec.forward).parameters)
    except (TypeError, ValueError):
        pass
    return names


def _clean_error(exc: BaseException, names: list[str]) -> bool:
    if not isinstance(exc, (ValueError, TypeError)):
        return False
    msg = str(exc)
    return any(n in msg for n in names)


def _run(rec, inputs, params, config):
    out, cache = call_forward(rec, inputs, params, config)
    return out, cache


def _expect_clean(rec, s, inputs, params, config, case, *, must_raise=False):
    """Run a bad-input case; succeed (and if so produce a finite output) or raise cleanly."""
    _COUNT["cases"] += 1
    names = _names(rec, s)
    try:
        out, _ = _run(rec, inputs, params, config)
    except Exception as exc:  # noqa: BLE001 - the type is what is being tested
        assert _clean_error(exc, names), (
            f"{rec.slug} [{case}]: raised {type(exc).__name__}: {exc!s:.300} — expected ValueError/TypeError "
            f"naming one of the arguments"
        )
        return "raised"
    assert not must_raise, f"{rec.slug} [{case}]: accepted invalid input without an error"
    outs = out if isinstance(out, tuple) else (out,)
    for o in outs:
        assert np.all(np.isfinite(o)) or case == "non-finite", f"{rec.slug} [{case}]: non-finite output"
    return "worked"


def _replace(s: Sample, name: str, value):
    inputs = dict(s.inputs)
    params = None if s.params is None else dict(s.params)
    config = dict(s.config)
    if name in inputs:
        inputs[name] = value
    elif params is not None and name in params:
        params[name] = value
    else:
        config[name] = value
    return inputs, params, config


def _array_args(s: Sample) -> dict[str, np.ndarray]:
    return s.arrays()


@pytest.mark.parametrize("rec", SWEPT, ids=SWEPT_IDS)
def test_bad_dtypes_raise_type_error(rec):
    s = rec.sample(np.random.default_rng(0), "tiny")
    for name, arr in _array_args(s).items():
        for bad, label in [(arr.astype(np.int64), "int64"), (arr.astype(np.complex128), "complex"),
                           (arr.astype(object), "object"), (arr.astype(bool), "bool")]:
            inputs, params, config = _replace(s, name, bad)
            _COUNT["cases"] += 1
            with pytest.raises(TypeError) as ei:
                _run(rec, inputs, params, config)
            assert name in str(ei.value), f"{rec.slug}: {label} {name}: message does not name it: {ei.value}"


@pytest.mark.parametrize("rec", SWEPT, ids=SWEPT_IDS)
def test_wrong_rank_and_shapes(rec):
    s = rec.sample(np.random.default_rng(0), "tiny")
    for name, arr in _array_args(s).items():
        # a 0-d array is never a valid attention/normalisation input
        inputs, params, config = _replace(s, name, np.asarray(arr.reshape(-1)[0]))
        _expect_clean(rec, s, inputs, params, config, f"0-d {name}",
                      must_raise=arr.ndim > 0 and name in s.inputs)
        # one dimension fewer / more
        if arr.ndim >= 1:
            inputs, params, config = _replace(s, name, arr[0])
            _expect_clean(rec, s, inputs, params, config, f"{name} without axis 0")
            inputs, params, config = _replace(s, name, arr[None])
            _expect_clean(rec, s, inputs, params, config, f"{name} with an extra leading axis")
            # mismatched batch, head, length and feature sizes: every axis grown by one in turn
            for axis in range(arr.ndim):
                grown = np.concatenate([arr, np.take(arr, [0], axis=axis)], axis=axis)
                inputs, params, config = _replace(s, name, grown)
                _expect_clean(rec, s, inputs, params, config, f"{name} axis {axis} + 1")
            # empty along axis 0
            inputs, params, config = _replace(s, name, arr[:0])
            _expect_clean(rec, s, inputs, params, config, f"empty {name}")
        # non-finite values
        bad = arr.copy()
        bad.reshape(-1)[0] = np.nan
        inputs, params, config = _replace(s, name, bad)
        _expect_clean(rec, s, inputs, params, config, "non-finite")


@pytest.mark.parametrize("rec", SWEPT, ids=SWEPT_IDS)
def test_bad_config_values(rec):
    s = rec.sample(np.random.default_rng(0), "tiny")
    sig = inspect.signature(rec.forward).parameters
    if "scale" in sig:
        for bad in (0.0, -1.0, float("nan")):
            inputs, params, config = _replace(s, "scale", bad)
            _COUNT["cases"] += 1
            with pytest.raises(ValueError, match="scale"):
                _run(rec, inputs, params, config)
    for key in ("attn_mask", "mask"):
        m = s.config.get(key)
        if isinstance(m, np.ndarray) and m.ndim >= 1:
            wrong = np.concatenate([m, m[..., :1]], axis=-1)
            inputs, params, config = _replace(s, key, wrong)
            _COUNT["cases"] += 1
            with pytest.raises((ValueError, TypeError)) as ei:
                _run(rec, inputs, params, config)
            assert key in str(ei.value), f"{rec.slug}: wrong-shape {key}: {ei.value}"


@pytest.mark.parametrize("rec", SWEPT_DIFF, ids=SWEPT_DIFF_IDS)
def test_backward_rejects_wrong_dout(rec):
    s = rec.sample(np.random.default_rng(0), "tiny")
    out, cache = _run(rec, s.inputs, s.params, s.config)
    _COUNT["cases"] += 1
    with pytest.raises((ValueError, TypeError)) as ei:
        rec.backward(np.ones(np.shape(out)[:-1] + (np.shape(out)[-1] + 1,)), cache)
    assert "dout" in str(ei.value), f"{rec.slug}: backward with a wrong-shape dout: {ei.value}"


@pytest.mark.parametrize("rec", SWEPT, ids=SWEPT_IDS)
def test_layouts_and_read_only_inputs_work(rec):
    """Non-contiguous, Fortran-order and read-only arrays give the same result as C-contiguous."""
    s = rec.sample(np.random.default_rng(0), "small")
    ref, _ = _run(rec, s.inputs, s.params, s.config)
    variants = {
        "fortran": lambda a: np.asfortranarray(a),
        "non-contiguous": lambda a: np.repeat(a, 2, axis=-1)[..., ::2] if np.ndim(a) else a,
        "read-only": lambda a: _ro(a),
    }
    for label, f in variants.items():
        inputs = {k: f(v) for k, v in s.inputs.items()}
        params = None if s.params is None else {k: f(v) for k, v in s.params.items()}
        _COUNT["cases"] += 1
        out, cache = _run(rec, inputs, params, s.config)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12, err_msg=f"{rec.slug}: {label}")
        if rec.differentiable:
            rec.backward(np.ones_like(out), cache)


def _ro(a):
    b = np.array(a, copy=True)
    b.setflags(write=False)
    return b


def _snapshot(obj):
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_snapshot(v) for v in obj)
    return obj


def _identical(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b))
    return True


@pytest.mark.parametrize("rec", SWEPT, ids=SWEPT_IDS)
def test_inputs_never_modified(rec):
    s = rec.sample(np.random.default_rng(0), "small")
    before = _snapshot((s.inputs, s.params, s.config))
    out, cache = _run(rec, s.inputs, s.params, s.config)
    dout = np.random.default_rng(1).standard_normal(np.shape(out))
    dout_before = dout.copy()
    if rec.differentiable:
        rec.backward(dout, cache)
        rec.backward(dout, cache)  # a backward may be called twice on one cache
    assert _identical(before, (s.inputs, s.params, s.config)), f"{rec.slug}: an input was modified"
    assert _identical(dout_before, dout), f"{rec.slug}: dout was modified"


@pytest.mark.parametrize("rec", SWEPT, ids=SWEPT_IDS)
def test_deterministic(rec):
    s = rec.sample(np.random.default_rng(0), "small")
    o1, c1 = _run(rec, s.inputs, s.params, s.config)
    o2, c2 = _run(rec, s.inputs, s.params, s.config)
    assert np.asarray(o1).tobytes() == np.asarray(o2).tobytes()
    if not rec.differentiable:
        return
    g = np.ones_like(o1)
    g1, g2 = rec.backward(g, c1), rec.backward(g, c2)
    assert all(np.asarray(g1[k]).tobytes() == np.asarray(g2[k]).tobytes() for k in g1)


@pytest.mark.parametrize("rec", IMPLEMENTED, ids=IDS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), size=st.sampled_from(["tiny", "small"]))
def test_properties(rec, seed, size):
    """Shapes/dtypes of forward and backward, finiteness, batch independence over axis 0."""
    s = rec.sample(np.random.default_rng(seed), size)
    out, cache = _run(rec, s.inputs, s.params, s.config)
    assert np.all(np.isfinite(out)), f"{rec.slug}: non-finite output for finite input"
    grads = rec.backward(np.ones_like(out), cache) if rec.differentiable else {}
    for k, v in (s.arrays() if rec.differentiable else {}).items():
        assert k in grads and np.shape(grads[k]) == np.shape(v), f"{rec.slug}: grad {k} shape"
        assert np.asarray(grads[k]).dtype == out.dtype
        assert np.all(np.isfinite(grads[k])), f"{rec.slug}: non-finite grad {k}"
    if rec.batched:
        b = np.shape(out)[0]
        assert b >= 2, f"{rec.slug}: batched sample needs batch size >= 2"
        inputs = {}
        for k, v in s.inputs.items():
            assert v.shape[0] == b, f"{rec.slug}: input {k} axis 0 is not the batch axis"
            w = v.copy()
            w[1:] = w[1:] * 1.5 + 0.25
            inputs[k] = w
        out2, _ = _run(rec, inputs, s.params, s.config)
        np.testing.assert_allclose(out2[0], out[0], rtol=1e-12, atol=1e-12,
                                   err_msg=f"{rec.slug}: batch element 0 depends on the other elements")
