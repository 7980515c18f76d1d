"""Tests the registry cannot express for the family-2 T3 slice: Differential Mamba, OpAmp attention
and SAGE's attention-guided extraction scoring (docs/differential/t3.md)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from refattn.attention.differential.diff_mamba import diff_mamba_forward, init_diff_mamba_params
from refattn.attention.differential.extraction_scoring import (
    assemble_document_scores,
    attention_guided_extraction_scoring,
    farthest_question_index,
    select_budget_windows,
)
from refattn.attention.differential.opamp import opamp_attention, opamp_attention_forward, opamp_gains
from refattn.operators.mamba import selective_scan

dm_mod = importlib.import_module("refattn.attention.differential.diff_mamba")


# --------------------------------------------------------------------------------------------
# Differential Mamba


def test_diff_mamba_branch_uses_the_shared_selective_scan():
    # One branch rebuilt by hand around refattn.operators.mamba.selective_scan: the block's M1 is
    # that scan (one implementation), not a copy.
    rng = np.random.default_rng(0)
    p = init_diff_mamba_params(rng, 4, d_state=3, d_conv=3, expand=2)
    x = rng.standard_normal((2, 6, 4))
    _, cache = diff_mamba_forward(x, p, depth=2)
    di, n, r = 8, 3, 1
    xz = x @ p["m1.in_proj.weight"]
    xi, z = xz[..., :di], xz[..., di:]
    w = p["m1.conv1d.weight"][:, 0]
    pad = np.concatenate([np.zeros((2, 2, di)), xi], axis=1)
    u = sum(w[:, j] * pad[:, j:j + 6] for j in range(3)) + p["m1.conv1d.bias"]
    u = u / (1 + np.exp(-u))
    xd = u @ p["m1.x_proj.weight"]
    y = selective_scan(np.swapaxes(u, 1, 2), np.swapaxes(xd[..., :r] @ p["m1.dt_proj.weight"], 1, 2),
                       -np.exp(p["m1.A_log"]), np.swapaxes(xd[..., r:r + n], 1, 2), np.swapaxes(xd[..., r + n:], 1, 2),
                       p["m1.D"], np.swapaxes(z, 1, 2), p["m1.dt_proj.bias"], delta_softplus=True)
    m1 = np.swapaxes(y, 1, 2) @ p["m1.out_proj.weight"]
    o2 = cache["o2"]
    lam = float(cache["lam"])
    a = m1 - lam * o2
    want = (1 - (0.8 - 0.6 * np.exp(-0.3))) * a / np.sqrt(np.mean(a * a, -1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(diff_mamba_forward(x, p, depth=2)[0], want, rtol=1e-12, atol=1e-13)


def test_diff_mamba_init_matches_upstream_defaults():
    p = init_diff_mamba_params(np.random.default_rng(1), 32, d_state=16)
    assert p["m1.in_proj.weight"].shape == (32, 64)        # expand=1 (DiffMamba default)
    assert p["m1.x_proj.weight"].shape == (32, 2 + 32)     # dt_rank = ceil(32/16) = 2
    np.testing.assert_allclose(np.exp(p["m2.A_log"][0]), np.arange(1, 17))
    dt = np.log1p(np.exp(p["m1.dt_proj.bias"]))            # softplus(bias) in [dt_min, dt_max]
    assert np.all(dt >= 1e-3 - 1e-12) and np.all(dt <= 0.1 + 1e-12)
    assert "m1.in_proj.bias" not in p and np.all(p["subln.weight"] == 1)


def test_diff_mamba_bad_input_names_the_argument():
    rng = np.random.default_rng(2)
    p = init_diff_mamba_params(rng, 4, d_state=2)
    x = rng.standard_normal((2, 3, 4))
    bad = dict(p, **{"m2.A_log": np.zeros((4, 3))})
    with pytest.raises(ValueError, match="m2.A_log"):
        diff_mamba_forward(x, bad, depth=1)
    with pytest.raises(ValueError, match="depth"):
        diff_mamba_forward(x, p)


# --------------------------------------------------------------------------------------------
# OpAmp attention


def test_opamp_gains_follow_the_op_amp_model():
    a, b = opamp_gains(10.0, 1.0)
    assert (a, b) == (10.5, -9.5)                          # A_d (M+ - M-) + A_c/2 (M+ + M-)
    a, b = opamp_gains(3.0, 2.0)
    assert a - b == 2 * 3.0 * 2.0 and a + b == 2.0         # differential gain A_d = K A_c; rows sum A_c
    with pytest.raises(TypeError, match="cmrr"):
        opamp_gains(float("inf"))


def test_opamp_cmrr_interpolates_linearly():
    # out is affine in K: out(K) = out(0) + K (out(1) - out(0)) for fixed adapters.
    rng = np.random.default_rng(3)
    mod = importlib.import_module("refattn.attention.differential.opamp")
    s = mod._sample(rng, "small")
    cfg = {k: v for k, v in s.config.items() if k != "cmrr"}
    o0, o1, o7 = (opamp_attention(s.inputs["x"], s.params, cmrr=k, **cfg) for k in (0.0, 1.0, 7.0))
    np.testing.assert_allclose(o7, o0 + 7.0 * (o1 - o0), rtol=1e-10, atol=1e-12)


def test_opamp_causal_and_mask():
    rng = np.random.default_rng(4)
    mod = importlib.import_module("refattn.attention.differential.opamp")
    s = mod._sample(rng, "small")
    cfg = dict(s.config, is_causal=True)
    out = opamp_attention(s.inputs["x"], s.params, **cfg)
    x2 = s.inputs["x"].copy()
    x2[:, -1] += 1.0
    np.testing.assert_allclose(opamp_attention(x2, s.params, **cfg)[:, :-1], out[:, :-1], atol=1e-13)
    n = s.inputs["x"].shape[1]
    keep = np.tril(np.ones((n, n), bool))
    np.testing.assert_allclose(opamp_attention(s.inputs["x"], s.params, **dict(cfg, is_causal=False), attn_mask=keep),
                               out, atol=1e-13)


def test_opamp_bad_params():
    rng = np.random.default_rng(5)
    mod = importlib.import_module("refattn.attention.differential.opamp")
    s = mod._sample(rng, "small")
    bad = dict(s.params)
    bad["adapter_k2.up.weight"] = bad["adapter_k2.up.weight"][:, :-1]
    with pytest.raises(ValueError, match="adapter_k2.up.weight"):
        opamp_attention_forward(s.inputs["x"], bad, **s.config)
    with pytest.raises(ValueError, match="adapter_activation"):
        opamp_attention_forward(s.inputs["x"], s.params, **dict(s.config, adapter_activation="tanh"))


# --------------------------------------------------------------------------------------------
# SAGE scoring and selection


def _brute_single_window(s, w):
    best, arg = -np.inf, 0
    for i in range(len(s) - w + 1):
        v = sum(float(t) for t in s[i:i + w])
        if v > best:
            best, arg = v, i
    return arg


def test_single_window_mode_is_the_brute_force_best_window():
    rng = np.random.default_rng(6)
    for _ in range(30):
        m = int(rng.integers(100, 800))
        s = rng.standard_normal(m)
        beta = float(rng.choice([0.005, 0.01, 0.02]))
        (a, b), = select_budget_windows(s, beta)
        w = max(1, int(m * beta))
        assert b - a == w and a == _brute_single_window(s, w)


def test_multi_window_mode_against_greedy_interval_reference():
    # Independent restatement on a boolean token mask: take windows in descending mean order; a
    # window touching the selection is unioned with it (through the overlapped ranges); otherwise it
    # is added or truncated at the budget.
    rng = np.random.default_rng(7)
    for _ in range(30):
        m = int(rng.integers(60, 500))
        s = np.round(rng.standard_normal(m), 1)
        beta = float(rng.uniform(0.03, 0.6))
        w, total = max(1, int(0.02 * m)), max(10, int(beta * m))
        means = [np.sum(s[i:i + w]) / w for i in range(m - w + 1)]
        order = sorted(range(len(means)), key=lambda i: -means[i])
        ranges = []
        for i in order:
            if sum(b - a for a, b in ranges) >= total:
                break
            hit = [r for r in ranges if i < r[1] and i + w > r[0]]
            if hit:
                ranges = [r for r in ranges if r not in hit] + [(min([i] + [r[0] for r in hit]),
                                                                  max([i + w] + [r[1] for r in hit]))]
                continue
            left = total - sum(b - a for a, b in ranges)
            if w > left:
                ranges.append((i, i + left))
                break
            ranges.append((i, i + w))
        assert select_budget_windows(s, beta) == sorted(ranges)


def test_degenerate_lengths():
    # Width-1 windows never overlap when adjacent (upstream's strict test), so a full budget keeps
    # every token as its own range; a one-token document is returned whole.
    assert select_budget_windows(np.arange(30.0), 1.0) == [(i, i + 1) for i in range(30)]
    assert select_budget_windows(np.array([0.3]), 0.01) == [(0, 1)]
    with pytest.raises(ValueError, match="budget"):
        select_budget_windows(np.arange(5.0), 0.0)


def test_chunk_assembly_and_differential():
    rng = np.random.default_rng(8)
    chunks = [rng.random(10), rng.random(10), rng.random(4)]
    doc = assemble_document_scores(chunks)
    np.testing.assert_allclose(doc[20:], chunks[2] * 0.4)
    np.testing.assert_allclose(doc[:20], np.concatenate(chunks[:2]))
    attn = rng.dirichlet(np.ones(6), size=(2, 2, 3, 4))
    ref = rng.dirichlet(np.ones(6), size=(2, 2, 3, 2))
    raw = attention_guided_extraction_scoring(attn, reference=None, context_start=1)
    raw_ref = attention_guided_extraction_scoring(ref, reference=None, context_start=1)
    np.testing.assert_allclose(attention_guided_extraction_scoring(attn, ref, context_start=1), raw - raw_ref)
    with pytest.raises(ValueError, match="attn_ref"):
        attention_guided_extraction_scoring(attn)


def test_farthest_question_brute_force():
    rng = np.random.default_rng(9)
    e = rng.standard_normal((6, 4))
    idx = farthest_question_index(e)
    for i in range(6):
        sims = [e[i] @ e[j] / np.linalg.norm(e[i]) / np.linalg.norm(e[j]) if j != i else 1.0 for j in range(6)]
        assert idx[i] == int(np.argmin(sims)) and idx[i] != i
