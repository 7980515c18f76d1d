"""The PDE demonstration (refattn/demos/pde.py): the Burgers data are right, the model's backward is
right, and training with refattn's own backwards lowers the loss >= 10x with a bounded test error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refattn.demos.pde import burgers_dataset, init_model, model_backward, model_forward, rel_l2


def test_burgers_solver_conserves_mean_dissipates_energy_and_converges():
    u0, ut = burgers_dataset(6, 64, seed=3)
    # d/dt of the mean is -(u^2/2)_x + nu u_xx integrated over a period = 0.
    np.testing.assert_allclose(ut.mean(1), u0.mean(1), atol=1e-12)
    # Viscous Burgers dissipates the L2 energy.
    assert np.all(np.mean(ut**2, 1) < np.mean(u0**2, 1))
    # Spatial and temporal resolution: a finer solver grid and a smaller step change nothing visible.
    _, fine = burgers_dataset(6, 64, seed=3, refine=4, dt=5e-4)
    assert np.abs(fine - ut).max() < 1e-8


def test_burgers_nu_to_zero_steepens():
    # Lower viscosity keeps larger gradients at T (a failing solver that just damps would not).
    _, a = burgers_dataset(4, 64, seed=1, nu=0.05)
    _, b = burgers_dataset(4, 64, seed=1, nu=0.02, refine=4)
    assert np.abs(np.diff(b, axis=1)).max() > 1.3 * np.abs(np.diff(a, axis=1)).max()


@pytest.mark.parametrize("model", ["galerkin", "fno"])
def test_model_backward_matches_finite_differences(model):
    rng = np.random.default_rng(0)
    p = init_model(rng, model=model, width=8, n_layers=2, n_head=2, modes=4, hidden=8)
    u0, _ = burgers_dataset(2, 16, k_max=4, seed=2)
    out, cache = model_forward(p, u0, n_head=2)
    G = rng.standard_normal(out.shape)
    grads = model_backward(p, G, cache)
    assert set(grads) == set(p)
    eps = 1e-6
    for name in p:
        v = rng.standard_normal(p[name].shape)
        old = p[name].copy()
        p[name] = old + eps * v
        lp = np.sum(model_forward(p, u0, n_head=2)[0] * G)
        p[name] = old - eps * v
        lm = np.sum(model_forward(p, u0, n_head=2)[0] * G)
        p[name] = old
        fd = (lp - lm) / (2 * eps)
        an = float(np.sum(grads[name] * v))
        assert abs(fd - an) <= 1e-6 * max(abs(fd), np.sum(np.abs(grads[name] * v)), 1e-8), (name, fd, an)


def test_training_lowers_loss_and_generalises():
    # A reduced setting of `python -m refattn.demos.pde`, in a single-threaded subprocess: the
    # arrays are tiny and a multi-threaded BLAS on a busy machine is an order of magnitude slower.
    code = (
        "import json; from refattn.demos.pde import train; "
        "r = train(model='galerkin', n_train=96, n_test=32, epochs=30, batch_size=8, lr=1e-2, n_layers=2, seed=0); "
        "print(json.dumps({'ratio': r.loss_ratio, 'err': r.test_rel_l2, 'first': r.initial_loss, 'last': r.losses[-1]}))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[1]))
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["ratio"] >= 10, f"loss fell only {res['ratio']:.1f}x ({res['first']:.3e} -> {res['last']:.3e})"
    assert res["err"] < 0.5, f"relative test error {res['err']:.3f}"


def test_rel_l2_is_relative():
    # A zero prediction has relative error exactly 1; a perfect one 0.
    assert rel_l2(np.zeros((2, 4)), np.ones((2, 4))) == 1.0
    assert rel_l2(np.ones((2, 4)), np.ones((2, 4))) == 0.0
