"""The verification tools must catch wrong backwards and wrong outside implementations."""

from __future__ import annotations

import numpy as np
import pytest

from refattn.nn.softmax import softmax_backward, softmax_forward
from refattn.registry import Sample
from refattn.testing import (
    GradcheckError,
    assert_close,
    compare_implementation,
    directional_check,
    gradcheck,
    to_numpy,
    tolerances,
)


def _sample():
    return Sample(inputs={"x": np.random.default_rng(0).standard_normal((2, 5))})


def _wrong_backward(dout, cache):
    return {"x": cache["p"] * dout}  # forgets the -sum(p * dout) term


def test_gradcheck_passes_a_correct_backward():
    rep = gradcheck(softmax_forward, softmax_backward, _sample())
    assert rep.passed and rep.max_rel < 1e-6
    assert "x" in str(rep)


def test_gradcheck_catches_a_wrong_backward_with_a_table():
    with pytest.raises(GradcheckError) as ei:
        gradcheck(softmax_forward, _wrong_backward, _sample())
    assert "FAIL" in str(ei.value) and "x" in str(ei.value)
    assert gradcheck(softmax_forward, _wrong_backward, _sample(), raise_on_failure=False).passed is False


def test_directional_check_catches_a_wrong_backward():
    assert directional_check(softmax_forward, softmax_backward, _sample()).passed
    with pytest.raises(GradcheckError):
        directional_check(softmax_forward, _wrong_backward, _sample())


def test_gradcheck_reports_missing_gradient_keys():
    with pytest.raises(GradcheckError, match="missing"):
        gradcheck(softmax_forward, lambda d, c: {}, _sample())


def test_gradcheck_requires_float64():
    s = Sample(inputs={"x": np.ones((2, 3), np.float32)})
    with pytest.raises(TypeError, match="float64"):
        gradcheck(softmax_forward, softmax_backward, s)


def test_assert_close_tolerances_and_message():
    assert tolerances(np.float64)[0] < tolerances(np.float32)[0] < tolerances(np.float16)[0]
    assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-13]))
    with pytest.raises(AssertionError, match="worst at"):
        assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.1]), name="out")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.ones(2), np.ones(3))
    assert_close(np.float32([1.0]), np.float64([1.0 + 1e-6]))  # float32 tolerance applies


def test_compare_implementation_numpy_pass_and_fail():
    def good(x, **cfg):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def bad(x, **cfg):
        return np.exp(x) / np.exp(x).sum(-1, keepdims=True) + 1e-3

    def vjp(dout, x, **cfg):
        p = good(x)
        return {"x": p * (dout - (p * dout).sum(-1, keepdims=True))}

    assert compare_implementation(good, "softmax", vjp=vjp, config={}).passed
    rep = compare_implementation(bad, "softmax", config={})
    assert not rep.passed and "FAIL" in str(rep)


def test_compare_implementation_torch_catches_a_wrong_scale():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def wrong(q, k, v, **cfg):  # ignores the requested scale
        return F.scaled_dot_product_attention(q, k, v)

    rep = compare_implementation(wrong, "sdpa", convert=torch.from_numpy, config={"scale": 0.3})
    assert not rep.passed
    assert to_numpy(torch.ones(2, requires_grad=True)).shape == (2,)


def test_compare_module_docstring_example_runs():
    """The PyTorch example in refattn.testing.compare's docstring (shown on the API page) runs."""
    pytest.importorskip("torch")
    import doctest

    import refattn.testing.compare as mod

    res = doctest.testmod(mod)
    assert res.attempted > 0 and res.failed == 0


def test_cli_bench_runs_the_source_benchmark(tmp_path, capsys):
    """`refattn bench` drives benchmarks/bench.py from the checkout (a tiny run)."""
    from refattn.cli import main

    assert main(["bench", "--sizes", "64", "--repeats", "1", "--cases", "linear", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench.json").exists()


# --------------------------------------------------------------------------------------------
# compare_implementation: never pass an incomplete check (issue #18)

from refattn import registry  # noqa: E402
from refattn.attention.softmax import sdpa_backward, sdpa_forward  # noqa: E402
from refattn.testing import CompareCase, compare_cases  # noqa: E402

SOFTMAX_FAMILY = ["sdpa", "attention_masks", "gqa_mqa", "multi_head_attention", "additive_attention_bias"]


def _np_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, *, alignment="top_left", scale_bug=1.0,
             diagonal=0, compute=None):
    """A NumPy 'outside implementation' of SDPA (GQA contiguous), with switchable bugs."""
    dt = compute or q.dtype
    q, k, v = (np.asarray(a, dt) for a in (q, k, v))
    r = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, r, axis=-3), np.repeat(v, r, axis=-3)
    s = (q @ np.swapaxes(k, -1, -2)) * dt.type(scale_bug * (q.shape[-1] ** -0.5 if scale is None else scale))
    n, m = s.shape[-2:]
    keep = np.ones(s.shape, bool)
    if attn_mask is not None:
        keep &= np.asarray(attn_mask)
    if is_causal:
        keep &= np.tri(n, m, (m - n if alignment == "bottom_right" else 0) + diagonal, dtype=bool)
    s = np.where(keep, s, -np.inf)
    mx = np.max(s, axis=-1, keepdims=True)
    e = np.where(keep, np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0)
    den = e.sum(-1, keepdims=True)
    p = e / np.where(den > 0, den, 1)
    return (p @ v).astype(np.result_type(q.dtype, np.float32) if compute else q.dtype)


def _ref_vjp(dout, q, k, v, **cfg):
    """A correct VJP (refattn's own), standing in for the user's autograd."""
    return sdpa_backward(dout, sdpa_forward(q, k, v, **cfg)[1])


def test_missing_gradient_is_a_failure():
    for partial in (lambda d, **kw: {}, lambda d, **kw: {"q": _ref_vjp(d, **kw)["q"]}):
        rep = compare_implementation(_np_sdpa, "sdpa", vjp=partial, config={"is_causal": True})
        assert not rep.passed
        assert "missing" in str(rep) and "grad k" in str(rep)
    assert compare_implementation(_np_sdpa, "sdpa", vjp=_ref_vjp, config={"is_causal": True}).passed


def test_grads_restriction_is_reported_as_skipped():
    only_q = lambda d, **kw: {"q": _ref_vjp(d, **kw)["q"]}  # noqa: E731
    rep = compare_implementation(_np_sdpa, "sdpa", vjp=only_q, config={}, grads=("q",))
    assert rep.passed
    assert rep.grads_compared == ["q"] and rep.grads_skipped == ["k", "v"]
    assert "NOT compared (grads=): k, v" in str(rep)
    with pytest.raises(ValueError, match="does not have"):
        compare_implementation(_np_sdpa, "sdpa", vjp=only_q, config={}, grads=("query",))
    rep = compare_implementation(_np_sdpa, "sdpa", config={})
    assert "not compared (no vjp given)" in str(rep)


def test_default_battery_catches_a_bottom_right_causal_mask():
    """Seed 0 of the sampler has N == M, where the two alignments agree; the battery does not stop there."""
    def bottom_right(q, k, v, **cfg):
        return _np_sdpa(q, k, v, **cfg, alignment="bottom_right")

    only_seed0 = compare_implementation(bottom_right, "sdpa", config={"is_causal": True}, cases=["sampler"], seeds=[0])
    assert only_seed0.passed  # the single case of yesterday's default: too easy
    rep = compare_implementation(bottom_right, "sdpa", config={"is_causal": True})
    assert not rep.passed
    failed = {r.case for r in rep.failures}
    assert {"n_lt_m", "n_gt_m", "decode"} <= failed
    assert {r.seed for r in rep.results} == {0, 1, 2}


def test_seeds_and_cases_choose_the_runs():
    rep = compare_implementation(_np_sdpa, "sdpa", config={}, cases=["odd", "gqa"], seeds=[4, 9])
    assert [(r.case, r.seed) for r in rep.results] == [("odd", 4), ("odd", 9), ("gqa", 4), ("gqa", 9)]
    assert compare_implementation(_np_sdpa, "sdpa", config={}, seed=5, cases="odd").results[0].seed == 5
    with pytest.raises(ValueError, match="its cases are"):
        compare_implementation(_np_sdpa, "sdpa", cases=["no_such_case"])


def _token_counts(rec, s):
    if "q" in s.inputs:
        return s.inputs["q"].shape[-2], s.inputs["k"].shape[-2]
    ctx = s.inputs.get("context", s.inputs["x"])
    return s.inputs["x"].shape[-2], ctx.shape[-2]


def _heads(rec, s):
    if "q" in s.inputs:
        return s.inputs["q"].shape[-3], s.inputs["k"].shape[-3]
    h = s.config["num_heads"]
    return h, s.config.get("num_kv_heads") or h


def _has_masked_row(rec, s):
    out, _ = registry.call_forward(rec, s.inputs, s.params, s.config)
    mask = s.config.get("attn_mask")
    if isinstance(mask, np.ndarray) and (~mask).all(axis=-1).any():
        return True
    lengths = s.config.get("key_lengths")
    return lengths is not None and (np.asarray(lengths) == 0).any()


@pytest.mark.parametrize("slug", SOFTMAX_FAMILY)
def test_softmax_family_battery_covers_the_risky_shapes(slug):
    rec = registry.get(slug)
    assert {"sampler", "odd", "masked_row"} <= set(rec.cases), sorted(rec.cases)
    samples = [b(np.random.default_rng(seed), None) for b in rec.cases.values() for seed in (0, 1, 2)]
    assert any(n != m for n, m in (_token_counts(rec, s) for s in samples)), "no case with N != M"
    if slug != "multi_head_attention":  # grouped kv heads are gqa_mqa's battery (nn.MultiheadAttention has none)
        assert any(h != hkv for h, hkv in (_heads(rec, s) for s in samples)), "no grouped-query case"
    assert any(any(d % 2 and d > 1 for d in s.inputs[next(iter(s.inputs))].shape) for s in samples), "no odd sizes"
    assert any(_has_masked_row(rec, s) for s in samples), "no fully masked row"
    for s in samples:  # every case is a valid sample refattn runs
        out, cache = registry.call_forward(rec, s.inputs, s.params, s.config)
        assert np.isfinite(out).all()
        rec.backward(np.ones_like(out), cache)


def test_case_builders_follow_the_callers_config():
    rec = registry.get("gqa_mqa")
    s = rec.cases["odd"](np.random.default_rng(0), {"num_heads": 4, "num_kv_heads": 2})
    assert s.config == {"num_heads": 4, "num_kv_heads": 2} and s.params["k_proj"].shape[1] == 2 * 5
    with pytest.raises(registry.CaseNotApplicable, match="num_kv_heads == num_heads"):
        rec.cases["gqa"](np.random.default_rng(0), {"num_heads": 4, "num_kv_heads": 4})
    masks = registry.get("attention_masks")
    with pytest.raises(registry.CaseNotApplicable, match="never masks a whole row"):
        masks.cases["masked_row"](np.random.default_rng(0), {"mask_kind": "causal"})
    s = masks.cases["n_gt_m"](np.random.default_rng(0), {"mask_kind": "padding"})
    assert s.config["mask_kind"] == "padding" and len(s.config["key_lengths"]) == s.inputs["q"].shape[0]
    s = registry.get("sdpa").cases["masked_row"](np.random.default_rng(0), {"is_causal": True})
    assert s.config["is_causal"] is True and s.config["attn_mask"].dtype == bool  # added, never overridden


def test_skipped_cases_are_listed_and_no_case_at_all_is_an_error():
    def fn(q, k, v, mask_kind=None, **cfg):
        from refattn.attention.softmax import masked_attention_forward
        return masked_attention_forward(q, k, v, mask_kind=mask_kind, **cfg)[0]

    rep = compare_implementation(fn, "attention_masks", config={"mask_kind": "causal"})
    assert rep.passed and [c for c, _ in rep.skipped_cases] == ["masked_row"]
    assert "skipped cases: masked_row (mask_kind 'causal'" in str(rep)
    with pytest.raises(ValueError, match="no case exists under this config"):
        compare_implementation(fn, "attention_masks", config={"mask_kind": "causal"}, cases=["masked_row"])


def test_report_shows_case_index_values_and_a_per_array_table():
    def wrong_shape(q, k, v, **cfg):
        return _np_sdpa(q, k, v, **cfg)[..., :-1]

    rep = compare_implementation(wrong_shape, "sdpa", config={}, cases=["odd"], seeds=[0])
    text = str(rep)
    assert "shape (3, 3, 7, 6), expected (3, 3, 7, 7)" in text and "inf" not in text
    # long parameter names do not run into the next column (was: `dout_proj.weight(16, 6)`)
    rec = registry.get("diff_attention_v1")

    def perfect(**kw):
        return registry.call_forward(rec, *_split(rec, kw))[0]

    def perfect_vjp(dout, **kw):
        return rec.backward(dout, registry.call_forward(rec, *_split(rec, kw))[1])

    rep = compare_implementation(perfect, rec, vjp=perfect_vjp, seeds=[0])
    assert rep.passed
    lines = str(rep).splitlines()
    header = next(line for line in lines if line.strip().startswith("array"))
    assert "runs ok" in header and "worst entry" in header and "expected" in header
    for line in lines:
        if line.strip().startswith("grad "):
            name = line.split()[1]
            assert line.split(name, 1)[1].startswith("  "), line


def _split(rec, kw):
    """Keyword arguments as compare_implementation passes them -> (inputs, params, config)."""
    import inspect

    sig = inspect.signature(rec.forward).parameters
    inputs = {k: kw.pop(k) for k in list(kw) if k in sig and sig[k].kind != inspect.Parameter.KEYWORD_ONLY}
    params = {k: kw.pop(k) for k in list(kw) if k not in sig} or None
    return inputs, params, kw


def test_wrong_scale_and_off_by_one_mask_look_different():
    rng = np.random.default_rng(0)
    sample = Sample(inputs={"q": rng.standard_normal((2, 2, 6, 4)), "k": rng.standard_normal((2, 2, 6, 4)),
                            "v": rng.standard_normal((2, 2, 6, 3))})
    cfg = {"is_causal": True}
    scale = compare_implementation(lambda **kw: _np_sdpa(**kw, scale_bug=1.3), "sdpa", sample=sample, config=cfg)
    mask = compare_implementation(lambda **kw: _np_sdpa(**kw, diagonal=1), "sdpa", sample=sample, config=cfg)
    assert not scale.passed and not mask.passed
    (_, a_scale), (_, a_mask) = scale.worst("out"), mask.worst("out")
    # off in every row that sees more than one key (row 0 of a causal mask sees only key 0)
    assert a_scale.bad == a_scale.size * 5 // 6 and min(a_scale.row_errors[1:]) > 1e-3
    assert a_mask.bad < a_mask.size and a_mask.row_errors[-1] < 1e-12  # the last row sees every key anyway

    def profile(rep):
        return next(line for line in str(rep).splitlines() if "per row (axis -2)" in line).split(":")[1].split()

    assert profile(scale)[0] == "0" and "0" not in profile(scale)[1:]
    assert profile(mask)[-1] == "0"


def test_float32_tolerance_follows_the_returned_dtype():
    def f32(q, k, v, **cfg):  # an honest float32 implementation given float64 inputs
        return _np_sdpa(q, k, v, **cfg, compute=np.dtype(np.float32))

    def f32_vjp(dout, q, k, v, **cfg):
        g = sdpa_backward(dout, sdpa_forward(*(a.astype(np.float32) for a in (q, k, v)), **cfg)[1])
        return {n: x.astype(np.float32) for n, x in g.items()}

    def f16_inside(q, k, v, **cfg):  # returns float32, but computed from float16-rounded inputs
        return _np_sdpa(*(a.astype(np.float16) for a in (q, k, v)), **cfg, compute=np.dtype(np.float32))

    rep = compare_implementation(f32, "sdpa", vjp=f32_vjp, config={"is_causal": True}, seeds=range(5))
    assert rep.passed, str(rep)
    assert set(rep.rules) == {"float32"} and "2 rms(err_naive)" in rep.rules["float32"]
    assert not compare_implementation(f16_inside, "sdpa", config={"is_causal": True}).passed
    # the same float32 output judged by the float64 rule (what an explicit tight rtol/atol does) fails
    assert not compare_implementation(f32, "sdpa", config={"is_causal": True}, rtol=1e-9, atol=1e-11).passed


def test_torch_float32_and_bfloat16_pass_the_dtype_rule():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def fn(q, k, v, attn_mask=None, is_causal=False, **cfg):
        if is_causal:
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            attn_mask = causal if attn_mask is None else attn_mask & causal
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)

    def vjp(dout, q, k, v, **cfg):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = fn(q, k, v, **cfg)
        return dict(zip("qkv", torch.autograd.grad(out, (q, k, v), dout.to(out.dtype))))

    for dt in (torch.float32, torch.bfloat16):
        def conv(a, dt=dt):
            return torch.from_numpy(a).to(dt) if a.dtype.kind == "f" else torch.from_numpy(a)

        rep = compare_implementation(fn, "sdpa", vjp=vjp, convert=conv, config={"is_causal": True}, seeds=range(4))
        assert rep.passed, str(rep)
        assert set(rep.rules) == {str(dt).split(".")[1]}


def test_bad_use_raises_clear_errors():
    with pytest.raises(ValueError, match="no mechanism 'sdpaa'; did you mean sdpa"):
        compare_implementation(_np_sdpa, "sdpaa")
    with pytest.raises(TypeError, match=r"fn must return one floating-point array .* of shape \(2, 4, 7, 3\); "
                                        r"got tuple of 2"):
        compare_implementation(lambda **kw: (_np_sdpa(**kw), None), "sdpa", config={}, cases=["sampler"])
    with pytest.raises(TypeError, match="got an array of dtype int64"):
        compare_implementation(lambda **kw: np.zeros((2, 4, 7, 3), int), "sdpa", config={}, cases=["sampler"])
    with pytest.raises(TypeError, match=r"vjp must return a dict \{name: gradient\} with the names \['q', 'k', 'v'\]"):
        compare_implementation(_np_sdpa, "sdpa", vjp=lambda d, **kw: list(_ref_vjp(d, **kw).values()), config={})
    with pytest.raises(ValueError, match=r"vjp returned gradients \['query'\]"):
        compare_implementation(_np_sdpa, "sdpa", vjp=lambda d, **kw: {"query": d}, config={})
    bad = Sample(inputs={"q": np.ones((1, 2, 3, 4)), "k": np.ones((1, 2, 5, 3)), "v": np.ones((1, 2, 5, 2))})
    with pytest.raises(ValueError, match=r"refattn's reference rejects .*k must have q's head width d=4"):
        compare_implementation(_np_sdpa, "sdpa", sample=bad)
    with pytest.raises(ValueError, match="not implemented"):
        compare_implementation(_np_sdpa, next(r.slug for r in registry.all(implemented=False)))


def test_an_exception_in_the_users_function_fails_that_run():
    def no_gqa(q, k, v, **cfg):
        if q.shape[-3] != k.shape[-3]:
            raise RuntimeError("heads differ")
        return _np_sdpa(q, k, v, **cfg)

    rep = compare_implementation(no_gqa, "sdpa", config={})
    assert not rep.passed and "gqa" in {r.case for r in rep.failures}
    assert all(r.error and "k (2, 1," in r.shapes or "k (2, 2," in r.shapes or "k (2, 3," in r.shapes
               for r in rep.failures)
    assert "raised RuntimeError in your function: heads differ" in str(rep)


# The pytest helper: a user's suite parametrizes over slugs, cases and seeds in one line.
@pytest.mark.parametrize("case", compare_cases("sdpa", "additive_attention_bias", cases=["n_gt_m", "masked_row"]),
                         ids=str)
def test_compare_cases_helper_parametrizes_a_suite(case):
    rec = registry.get(case.slug)
    impl = {"sdpa": _np_sdpa,
            "additive_attention_bias": lambda **kw: registry.call_forward(rec, *_split(rec, kw))[0]}[case.slug]
    report = case.check(impl, config={"is_causal": True} if case.slug == "sdpa" else None)
    assert report.passed and len(report.results) == 1


def test_compare_case_check_fails_and_skips():
    case = CompareCase("sdpa", "n_lt_m", 0)
    assert str(case) == "sdpa-n_lt_m-0"
    with pytest.raises(AssertionError, match="compare_implementation\\[sdpa\\]: FAIL"):
        case.check(lambda **kw: _np_sdpa(**kw, alignment="bottom_right"), config={"is_causal": True})
    import unittest

    with pytest.raises(unittest.SkipTest, match="never masks a whole row"):
        CompareCase("attention_masks", "masked_row", 0).check(_np_sdpa, config={"mask_kind": "causal"})
    assert len(compare_cases("sdpa", seeds=[0])) == len(registry.get("sdpa").cases)
    with pytest.raises(ValueError, match="has the cases"):
        compare_cases("sdpa", cases=["nope"])


def _doc_block(lang_marker: str) -> str:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "testing-your-implementation.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return next(b for b in blocks if lang_marker in b)


def test_docs_pytorch_example_runs():
    pytest.importorskip("torch")
    exec(compile(_doc_block("import torch"), "testing-your-implementation.md[torch]", "exec"), {})


def test_docs_jax_example_runs():
    """jax is optional (not installed in CI): this runs where it is."""
    pytest.importorskip("jax")
    exec(compile(_doc_block("import jax"), "testing-your-implementation.md[jax]", "exec"), {})
