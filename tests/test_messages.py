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
    assert "input width" in str(ei.value) and "If this is PyTorch's" in str(ei.value)


@pytest.mark.parametrize("slug", ["diff_attention_v1", "transolver_physics_attention", "galerkin_attention"])
def test_a_wider_input_is_not_blamed_on_a_transposed_weight(slug):
    rec = registry.get(slug)
    s = rec.sample(np.random.default_rng(0), "tiny")
    name = "pos" if slug == "galerkin_attention" else "x"
    inputs = dict(s.inputs, **{name: np.concatenate([s.inputs[name], s.inputs[name][..., :1]], axis=-1)})
    with pytest.raises(ValueError) as ei:
        registry.call_forward(rec, inputs, s.params, s.config)
    hint = str(ei.value).split("got ", 1)[1]
    assert "(axis 0 is the input width" in hint and "did the last axis of an input change?" in hint
    assert "(PyTorch's nn.Linear.weight is (out, in): pass its transpose)" not in hint


def test_linear_messages():
    x = np.ones((2, 4))
    with pytest.raises(ValueError) as ei:
        linear_forward(x, {"weight": np.ones((3, 3))})
    assert "transpose" not in str(ei.value) and "x has 4 features" in str(ei.value)
    with pytest.raises(ValueError, match="pass its transpose"):
        linear_forward(x, {"weight": np.ones((5, 4))})
    with pytest.raises(ValueError, match=r"params is missing keys \['weight'\].*'weigth' -> 'weight'"):
        linear_forward(x, {"weigth": np.ones((4, 5))})
