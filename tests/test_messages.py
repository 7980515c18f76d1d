"""Error messages of the shared validators say what is wrong (issue #18, "Misleading messages")."""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn._checks import check_param_keys, check_params
from refattn.nn.linear import linear_forward


def test_a_missing_key_is_reported_as_missing_even_with_unknown_keys():
    with pytest.raises(ValueError) as ei:
        check_param_keys({"q.weigth": 1, "q.bias": 1}, ("q.weight", "q.bias"))
    msg = str(ei.value)
    assert msg.startswith("params is missing keys ['q.weight']")
    assert "unknown keys ['q.weigth']" in msg and "'q.weigth' -> 'q.weight'?" in msg
    with pytest.raises(ValueError, match=r"params has unknown keys \['extra'\]; expected \['a'\]"):
        check_param_keys({"a": 1, "extra": 1}, ("a",))
    with pytest.raises(ValueError, match=r"params is missing keys \['b'\] \(expected shapes: b \(3,\)\)"):
        check_params({"a": np.ones(2)}, {"a": (2,), "b": (3,)})


def test_gnot_missing_cross_attention_key_is_named():
    """Without ``keys.0.weight`` GNOT reads the params as self-attention ones; the message must
    still name the key that is missing (it said "unknown keys ['keys.0.bias', ...]")."""
    rec = registry.get("gnot_hna_attention")
    s = rec.sample(np.random.default_rng(0), "tiny")
    assert "keys.0.weight" in s.params
    params = {k: v for k, v in s.params.items() if k != "keys.0.weight"}
    with pytest.raises(ValueError) as ei:
        registry.call_forward(rec, s.inputs, params, s.config)
    assert str(ei.value).startswith("params is missing keys ['keys.0.weight'] (layer 'keys.0' has only ['bias'])")


def test_transpose_hint_only_when_the_transpose_fits():
    with pytest.raises(ValueError, match="pass its transpose"):
        check_params({"q.weight": np.ones((8, 4))}, {"q.weight": (4, 8)})
    with pytest.raises(ValueError) as ei:
        check_params({"q.weight": np.ones((3, 8))}, {"q.weight": (4, 8)})
    assert "transpose" not in str(ei.value) and "input width" in str(ei.value)
    with pytest.raises(ValueError) as ei:  # a square weight for a wider input: not a transpose
        check_params({"q.weight": np.ones((3, 3))}, {"q.weight": (4, 4)})
    assert "transpose" not in str(ei.value)
    with pytest.raises(ValueError) as ei:  # (3, 4) for (4, 4): either reading fits, both are named
        check_params({"q.weight": np.ones((3, 4))}, {"q.weight": (4, 4)})
    assert "input width" in str(ei.value) and "if this is PyTorch's" in str(ei.value)
    assert "must have shape (4, 4)" not in str(ei.value)  # the output width may be read off this very weight


@pytest.mark.parametrize("slug", ["diff_attention_v1", "transolver_physics_attention", "galerkin_attention"])
def test_a_wider_input_is_not_blamed_on_a_transposed_weight(slug):
    rec = registry.get(slug)
    s = rec.sample(np.random.default_rng(0), "tiny")
    name = "pos" if slug == "galerkin_attention" else "x"
    inputs = dict(s.inputs, **{name: np.concatenate([s.inputs[name], s.inputs[name][..., :1]], axis=-1)})
    with pytest.raises(ValueError) as ei:
        registry.call_forward(rec, inputs, s.params, s.config)
    hint = str(ei.value).split("got ", 1)[1]
    assert "axis 0 is the input width" in hint and "did the last axis of an input change?" in hint
    # the transpose may be offered as one reading, never as the only one
    assert "pass its transpose" not in hint or "if it is already (in, out)" in hint


def test_linear_messages():
    x = np.ones((2, 4))
    with pytest.raises(ValueError) as ei:
        linear_forward(x, {"weight": np.ones((3, 3))})
    assert "transpose" not in str(ei.value) and "x has 4 features" in str(ei.value)
    with pytest.raises(ValueError, match="pass its transpose"):
        linear_forward(x, {"weight": np.ones((5, 4))})
    with pytest.raises(ValueError, match=r"params is missing keys \['weight'\].*'weigth' -> 'weight'"):
        linear_forward(x, {"weigth": np.ones((4, 5))})


def _transposed_cases(rec):
    """(key, true shape, params with that non-square 2-D ``*weight`` transposed) for a record's tiny sample."""
    s = rec.sample(np.random.default_rng(0), "tiny")
    for k, v in (s.params or {}).items():
        if isinstance(v, np.ndarray) and v.ndim == 2 and v.shape[0] != v.shape[1] and k.endswith("weight"):
            yield k, v.shape, s, dict(s.params, **{k: v.T.copy()})


_WEIGHTED = [r.slug for r in registry.all(implemented=True)
             if any(True for _ in _transposed_cases(r))]


@pytest.mark.parametrize("slug", _WEIGHTED)
def test_a_transposed_weight_is_never_accepted(slug):
    """PyTorch's (out, in) weight passed where refattn wants (in, out) must raise, never compute."""
    rec = registry.get(slug)
    for key, _, s, params in _transposed_cases(rec):
        with pytest.raises((ValueError, TypeError)):
            registry.call_forward(rec, s.inputs, params, s.config)
            pytest.fail(f"{slug}: {key} transposed was accepted")


# 2-D ``*weight`` params that are not nn.Linear weights: PyTorch lays them out as refattn does, so
# their message must state the shape WITHOUT a transpose hint (transposing would be wrong advice).
_NOT_LINEAR = {
    ("position_coupling", "wpe.weight"),  # nn.Embedding table (num_positions, D), (num, dim) in torch too
}
# (slug, key) whose first error legitimately concerns another key (e.g. a width two keys must agree
# on, where the other key is checked first). None at present: a message that blames another key
# must still name this one with its transpose (e.g. "pass the transpose of <key>").
_OTHER_KEY: set = set()


def _key_forms(key, msg):
    """The names a message may give ``key``: the full key, or inside a sublayer's message
    ("sublayer 'experts.0' (...): w1.weight ...") the key relative to the sublayer's prefix."""
    forms = [key]
    parts = key.split(".")
    for i in range(1, len(parts) - 1):
        if f"'{'.'.join(parts[:i])}'" in msg:
            forms.append(".".join(parts[i:]))
    return forms


def _named(name, msg):
    import re

    return re.search(r"(?<![\w.])" + re.escape(name) + r"(?![\w])", msg) is not None


@pytest.mark.parametrize("slug", _WEIGHTED)
def test_transposed_weight_message_names_the_transpose(slug):
    """Issue #20: an untransposed DIFF V2 ``q_proj`` (48, 24) was told "must have shape (24, 24)".
    For every record: PyTorch's (out, in) layout of a non-square Linear weight gets a message that
    names the key and its transpose, and never states a wrong expected shape for that key."""
    import re

    rec = registry.get(slug)
    for key, true, s, params in _transposed_cases(rec):
        with pytest.raises(ValueError) as ei:
            registry.call_forward(rec, s.inputs, params, s.config)
        msg = str(ei.value)
        forms = _key_forms(key, msg)
        for name in forms:
            stated = re.search(r"(?<![\w.])" + re.escape(name) + r"[^;]*?must have shape \((\d+), (\d+)\)", msg)
            assert stated is None or tuple(map(int, stated.groups())) == tuple(true), (key, msg)
        if (slug, key) in _OTHER_KEY:
            continue
        assert any(_named(name, msg) for name in forms), (key, msg)
        if (slug, key) in _NOT_LINEAR:
            assert "transpose" not in msg, (key, msg)
        else:
            assert "pass its transpose" in msg or f"pass the transpose of {key}" in msg, (key, msg)


def test_diff_v2_untransposed_q_proj_message():
    from refattn.attention.differential import diff_attention_v2

    rng = np.random.default_rng(0)
    C, H, d = 24, 2, 12
    p = {"q_proj.weight": rng.normal(size=(2 * H * d, C)),  # torch layout (out, in)
         "k_proj.weight": rng.normal(size=(C, H * d)), "v_proj.weight": rng.normal(size=(C, H * d)),
         "o_proj.weight": rng.normal(size=(H * d, C)), "lambda_proj.weight": rng.normal(size=(C, H))}
    with pytest.raises(ValueError) as ei:
        diff_attention_v2(rng.normal(size=(1, 4, C)), p, num_heads=H)
    msg = str(ei.value)
    assert msg.startswith("q_proj.weight must have shape (24, out)") and "got (48, 24)" in msg
    assert "pass its transpose, of shape (24, 48)" in msg
