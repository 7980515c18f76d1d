"""Upstream fidelity of refattn's full layers and upstream options (issue #20), in float64.

Each test builds a PyTorch module written from the official upstream file
(`tests/_upstream_layers.py`, which cites file@commit) or uses PyTorch's own module
(``torch.nn.MultiheadAttention``), copies its parameters into refattn through the builder's
state-dict map, and compares the output and every input and parameter gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _upstream_layers as U  # noqa: E402

TOL = 1e-12


def _assert_close(errs, tol=TOL):
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"max relative errors above {tol}: {bad} (all: {errs})"


# ------------------------------------------------------------------------------ issue item 11


@pytest.mark.parametrize("causal", [True, False])
def test_performer_pytorch_fast_attention(causal):
    rng = np.random.default_rng(11)
    layer = U.performer_fast_attention(rng, head_dim=4, nb_features=9, causal=causal)
    q, k, v = (0.7 * rng.standard_normal((2, 3, 7, 4)) for _ in range(3))
    _assert_close(U.compare_layer(layer, {"q": q, "k": k, "v": v}, rng))


def test_performer_key_sum_eps_matters_when_causal():
    from refattn.attention.linear import performer_forward

    rng = np.random.default_rng(12)
    layer = U.performer_fast_attention(rng, head_dim=4, nb_features=9, causal=True)
    q, k, v = (0.7 * rng.standard_normal((2, 3, 7, 4)) for _ in range(3))
    ref = layer.module.double()(*(torch.tensor(a) for a in (q, k, v))).numpy()
    without = performer_forward(q, k, v, **dict(layer.config, key_sum_eps=0.0))[0]
    assert np.abs(without - ref).max() > 1e-7


# ------------------------------------------------------------------------------ issue item 5


@pytest.mark.parametrize("act,norm,causal,urpe", [("elu", "simplermsnorm", True, True),
                                                  ("elu", "simplermsnorm", False, True),
                                                  ("gelu", "layernorm", True, False),
                                                  ("1+elu", "layernorm", False, True)])
def test_transnormer_norm_linear_attention(act, norm, causal, urpe):
    rng = np.random.default_rng(5)
    layer = U.transnormer_norm_linear_attention(rng, embed_dim=12, num_heads=3, act=act, norm=norm,
                                                causal=causal, urpe=urpe)
    x = rng.standard_normal((2, 6, 12))
    _assert_close(U.compare_layer(layer, {"x": x}, rng))
