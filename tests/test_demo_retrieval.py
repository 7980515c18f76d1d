"""The key-retrieval demonstration: its training gradients and its measurable claim."""

from __future__ import annotations

import numpy as np
import pytest

from refattn.demos import retrieval as R

SMALL = R.RetrievalConfig(n_tokens=6, d_key=3, n_values=4, n_hard=2, batch=3, steps=2)


@pytest.mark.parametrize("kind", R.KINDS)
def test_training_gradients_match_finite_differences(kind):
    data = R.make_retrieval_data(3, SMALL, rng=1)
    params = R.init_params(kind, SMALL, rng=2)
    if kind == "diff":
        params["lam"] = np.array([0.4])
    _, grads = R.loss_and_grads(kind, params, data, SMALL)
    eps = 1e-6
    for name, p in params.items():
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            lp, _ = R.loss_and_grads(kind, params, data, SMALL)
            p[i] = old - eps
            lm, _ = R.loss_and_grads(kind, params, data, SMALL)
            p[i] = old
            num[i] = (lp - lm) / (2 * eps)
        err = np.abs(num - grads[name]).max() / max(np.abs(num).max(), 1e-8)
        assert err < 1e-6, f"{kind}: gradient of {name} off by {err:.2e}"


def test_diff_with_lambda_zero_and_tied_first_map_is_plain():
    data = R.make_retrieval_data(5, SMALL, rng=3)
    plain = R.init_params("plain", SMALL, rng=4)
    diff = R.init_params("diff", SMALL, rng=5)
    diff.update(wq1=plain["wq"], wk1=plain["wk"], lam=np.array([0.0]))
    m_plain = R.attention_maps("plain", plain, data, SMALL)["plain"]
    m_diff = R.attention_maps("diff", diff, data, SMALL)
    assert np.allclose(m_diff["diff"], m_plain, atol=1e-14)
    assert np.allclose(m_diff["a1"], m_plain, atol=1e-14)
    assert np.allclose(m_plain.sum(-1), 1.0)


def test_distractor_share_definition():
    maps = np.array([[0.5, 0.3, 0.2], [0.9, -0.05, 0.05]])
    share = R.distractor_share(maps, np.array([0, 0]))
    assert np.allclose(share, [0.5, 0.1])


def test_differential_attention_puts_less_mass_on_distractors():
    # The demonstration's claim, on held-out episodes, with the default (tutorial) configuration.
    res = R.run_demo(seed=0, n_eval=256)
    mp, md = res["metrics"]["plain"], res["metrics"]["diff"]
    assert res["losses"]["plain"][-50:].mean() < res["losses"]["plain"][:50].mean(), "plain model did not train"
    assert res["losses"]["diff"][-50:].mean() < res["losses"]["diff"][:50].mean(), "diff model did not train"
    assert md["distractor_share"] < mp["distractor_share"] - 0.03, (mp, md)
    assert md["accuracy"] >= mp["accuracy"], (mp, md)
    n = res["config"].n_tokens
    for key in ("plain", "a1", "a2", "diff"):
        assert res["maps"][key].shape == (256, n)
    # rows of the differential map sum to 1 - lambda (signed weights), the plain rows to 1
    lam = float(res["params"]["diff"]["lam"][0])
    assert np.allclose(res["maps"]["diff"].sum(-1), 1 - lam)
    assert np.allclose(res["maps"]["plain"].sum(-1), 1.0)


def test_column_order_puts_target_then_hard_distractors_first():
    cfg = R.RetrievalConfig(n_tokens=9, n_hard=3)
    data = R.make_retrieval_data(4, cfg, rng=6)
    order = R.column_order(data)
    e = np.arange(4)[:, None]
    assert np.all(order[:, 0] == data.target)
    assert data.hard[e, order[:, 1:4]].all() and not data.hard[e, order[:, 4:]].any()
    assert np.all(np.sort(order, axis=-1) == np.arange(9))
