"""Slice 5 of the softmax breadth (masks and selection): what the registry cannot express.

Selections against brute-force loops, special cases named by the catalogue, argument errors."""

import importlib

import numpy as np
import pytest

crate = importlib.import_module("refattn.attention.softmax.crate")


# --------------------------------------------------------------------------------------------- CRATE

def test_crate_zero_dictionary_is_shifted_relu_of_layernorm():
    # D = 0: Z+ = ReLU(X - eta*lambda) with X = LN(Z + MSSA(LN Z))
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 5, 6))
    p = crate.init_crate_params(rng, 6, 2, 3)
    p["ff.fn.weight"] = np.zeros((6, 6))
    y, c = crate.crate_block_forward(z, p, num_heads=2, step_size=0.5, lambd=0.2)
    assert np.allclose(y, np.maximum(c["x"] - 0.1, 0.0), atol=1e-14)


def test_crate_tied_projection_equals_mha_with_three_equal_weights():
    # the MSSA half-step is MHA whose q/k/v weights are all U (checked through the residual Z^{1/2})
    from refattn.attention.softmax.mha import mha_forward
    from refattn.nn.norms import layer_norm
    rng = np.random.default_rng(1)
    z = rng.standard_normal((2, 4, 6))
    p = crate.init_crate_params(rng, 6, 3, 2)
    _, c = crate.crate_block_forward(z, p, num_heads=3)
    u = p["attn.fn.qkv.weight"]
    y1 = layer_norm(z, {"weight": p["attn.norm.weight"], "bias": p["attn.norm.bias"]})
    o, _ = mha_forward(y1, params={"q_proj": u, "k_proj": u, "v_proj": u, "out_proj": p["attn.fn.to_out.0.weight"]},
                       num_heads=3)
    assert np.allclose(c["oc"] @ p["attn.fn.to_out.0.weight"], o, atol=1e-13)


def test_crate_bad_arguments():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((2, 4, 6))
    p = crate.init_crate_params(rng, 6, 2, 3)
    with pytest.raises(ValueError, match="attn.fn.qkv.weight"):
        crate.crate_block_forward(z, p, num_heads=4)
    q = {k: v for k, v in p.items() if not k.startswith("attn.fn.to_out")}
    with pytest.raises(ValueError, match="qkv width must equal"):
        crate.crate_block_forward(z, {**q, "attn.fn.qkv.weight": np.ones((6, 4))}, num_heads=2)
    with pytest.raises(ValueError, match="step_size"):
        crate.crate_block_forward(z, p, num_heads=2, step_size=-1.0)
