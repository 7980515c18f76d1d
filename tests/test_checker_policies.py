"""Policies the generated tests enforce, checked on records built to break them (issue 18).

* a forward-only record (``differentiable=False``) gets every forward test and no gradient test;
* the cache never aliases the returned ``out`` (tests/test_robustness.py sweeps every record;
  here, the records it caught);
* a NaN in dout propagates (ONO raised SciPy's ``check_finite`` error);
* differential-core shape errors name the argument that is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_registry
import test_robustness

from refattn import registry
from refattn.registry import Mechanism, Sample
from refattn.testing import compare_implementation
from refattn.testing.runner import record_check_names, run_record_checks


def _sort_forward(x):
    """Sorted values along the last axis (a forward-only test record: no backward)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a floating array; got {x.dtype}")
    dt = np.float32 if x.dtype == np.float16 else x.dtype
    return np.sort(x.astype(dt), axis=-1), None


def _sort_sample(rng, size="tiny"):
    n = 3 if size == "tiny" else 6
    return Sample({"x": rng.standard_normal((2, n, 4))})


FORWARD_ONLY = Mechanism(
    slug="sort_forward_only", family="5-building-blocks", tier="primitive", title="sort (forward-only)", paper="-",
    forward=_sort_forward, sample=_sort_sample, differentiable=False, docs="building-blocks.md#softmax",
    reference=lambda x: np.sort(x, axis=-1), notes="no backward: a test record", module=__name__,
    checks={"ascending": lambda rng: None},
)


def test_forward_only_record_is_implemented_and_left_out_of_gradient_selections(monkeypatch):
    assert FORWARD_ONLY.implemented
    monkeypatch.setitem(registry._RECORDS, FORWARD_ONLY.slug, FORWARD_ONLY)
    assert FORWARD_ONLY in registry.all(implemented=True)
    assert FORWARD_ONLY not in registry.all(implemented=True, differentiable=True)
    assert FORWARD_ONLY in registry.all(differentiable=False)


def test_runner_runs_forward_checks_only_for_a_forward_only_record():
    assert record_check_names(FORWARD_ONLY) == ["reference", "check:ascending"]
    res = run_record_checks(FORWARD_ONLY)
    assert [c.check for c in res.results] == ["reference", "check:ascending"]
    assert res.passed, [c.message for c in res.results]


def test_generated_forward_tests_run_on_a_forward_only_record():
    rec = FORWARD_ONLY
    test_registry.test_record_is_complete(rec)
    test_registry.test_dtype_behaviour(rec, np.float32, np.float32)
    test_robustness.test_layouts_and_read_only_inputs_work(rec)
    test_robustness.test_inputs_never_modified(rec)
    test_robustness.test_deterministic(rec)
    test_robustness.test_properties(rec=rec)


def test_cli_shows_and_checks_a_forward_only_record(monkeypatch, tmp_path, capsys):
    import json

    from refattn import cli

    monkeypatch.setitem(registry._RECORDS, FORWARD_ONLY.slug, FORWARD_ONLY)
    monkeypatch.setattr(cli, "_STATUS_FILE", tmp_path / "status.json")
    assert cli.main(["show", FORWARD_ONLY.slug]) == 0
    shown = capsys.readouterr().out
    assert "none (forward-only: no backward: a test record)" in shown
    assert "checks       reference, ascending" in shown
    assert cli.main(["check", FORWARD_ONLY.slug, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["check"] for r in rows] == ["reference", "check:ascending"]
    assert cli._fd_cell(FORWARD_ONLY, {}) == "no backward"


def test_compare_refuses_a_vjp_for_a_forward_only_record(monkeypatch):
    monkeypatch.setitem(registry._RECORDS, FORWARD_ONLY.slug, FORWARD_ONLY)
    with pytest.raises(ValueError, match="forward-only"):
        compare_implementation(lambda x: np.sort(x, -1), FORWARD_ONLY.slug, vjp=lambda g, x: {"x": g})


@pytest.mark.parametrize("slug", ["softmax", "linear_attention_katharopoulos", "performer_favor_plus",
                                  "kernelized_attention_rpe_fft", "online_softmax_flash_attention",
                                  "memory_efficient_attention_rabe_staats", "tree_attention_merge"])
def test_records_that_kept_out_in_their_cache(slug):
    test_robustness.test_output_updated_in_place_leaves_gradients_unchanged(registry.get(slug))


def test_ono_backward_propagates_a_nan_dout():
    rec = registry.get("ono_orthogonal_attention")
    s = rec.sample(np.random.default_rng(0), "tiny")
    out, cache = rec.forward(**s.inputs, params=s.params, **s.config)
    dout = np.ones_like(out)
    dout[0, 0, 0] = np.nan
    with np.errstate(all="ignore"):
        grads = rec.backward(dout, cache)
    assert np.isnan(grads["psi"]).any() and np.isnan(grads["mu"]).any()


@pytest.mark.parametrize("name", ["q1", "k1", "q2", "k2", "v"])
def test_differential_core_names_the_array_that_lost_an_axis(name):
    rec = registry.get("diff_attention_core")
    s = rec.sample(np.random.default_rng(0), "tiny")
    inputs = dict(s.inputs)
    inputs[name] = inputs[name][0]
    with pytest.raises(ValueError, match=rf"^{name} must have 4 dimensions"):
        rec.forward(**inputs, **s.config)


_V1_PARAM = ("q_proj.", "k_proj.", "v_proj.", "out_proj.", "subln.", "lambda_q1", "lambda_k1", "lambda_q2",
             "lambda_k2")


def _v1_split(kw):
    return {k: kw.pop(k) for k in list(kw) if k.startswith(_V1_PARAM)}, kw


def _v1_fn(x, **kw):
    from refattn.attention.differential.v1 import diff_attention_v1

    params, config = _v1_split(kw)
    return diff_attention_v1(x, params, **config)


def _v1_vjp(dout, x, **kw):
    from refattn.attention.differential.v1 import diff_attention_v1_backward, diff_attention_v1_forward

    params, config = _v1_split(kw)
    return diff_attention_v1_backward(dout, diff_attention_v1_forward(x, params, **config)[1])


@pytest.mark.parametrize("config,subln_keys", [
    ({"num_heads": 2, "depth": 3, "subln": "rms", "subln_affine": False, "is_causal": True}, []),
    ({"num_heads": 2, "depth": 1, "subln": "rms"}, ["subln.weight"]),
    ({"num_heads": 4, "num_kv_heads": 2, "depth": 0, "subln": "layer"}, ["subln.bias", "subln.weight"]),
    ({"num_heads": 2, "lambda_init": 0.3, "subln": "none"}, []),
])
def test_diff_attention_v1_sample_and_compare_cases_follow_the_callers_config(config, subln_keys):
    """The paper configuration (RMSNorm without affine) used to fail: the default battery paired
    the caller's config with sampler params drawn for ``subln="layer"`` ('unknown keys subln.bias')."""
    rec = registry.get("diff_attention_v1")
    for size in ("tiny", "small"):
        for seed in range(4):
            s = rec.sample(np.random.default_rng(seed), size, config)
            assert sorted(k for k in s.params if k.startswith("subln")) == subln_keys
            assert s.config == config
            rec.forward(**s.inputs, params=s.params, **s.config)
    report = compare_implementation(_v1_fn, "diff_attention_v1", vjp=_v1_vjp, config=config)
    assert report.passed, str(report)


def test_dint_compare_cases_follow_the_callers_config():
    from refattn.attention.differential.dint import dint_attention

    def fn(x, **kw):
        params, config = _v1_split(kw)
        return dint_attention(x, params, **config)

    config = {"num_heads": 2, "depth": 2, "subln": "rms", "subln_affine": False, "integral": "all"}
    report = compare_implementation(fn, "dint_attention", config=config)
    assert report.passed, str(report)


@pytest.mark.numba
def test_numba_causal_linear_kernel_returns_a_copy_of_its_buffer():
    """The scan kernel's backward reads its output buffer: the caller's array must be another."""
    from refattn.kernels.cpu.linear import causal_linear_attention_backward, causal_linear_attention_forward

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 4))
    g = rng.standard_normal((2, 2, 5, 4))
    out, cache = causal_linear_attention_forward(q, k, v)
    expected = causal_linear_attention_backward(g, cache)
    out *= -3.0
    got = causal_linear_attention_backward(g, cache)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
