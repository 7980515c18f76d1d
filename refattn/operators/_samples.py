"""Samplers and identity checks shared by the registry records of several operator modules.

Verification only (no mechanism math, nothing registered): the Transolver family (Transolver,
LinearNO, GALE) shares its sample sizes, parameter perturbation and two property checks; FactFormer
and IFactFormer-m share one sampler. The module is private; the names inside are public so that
the mechanism modules import them without reaching for a private name.
"""

from __future__ import annotations

import numpy as np

from ..registry import Sample

__all__ = ["perturb_params", "slice_sizes", "check_point_permutation", "check_uniform_refinement",
           "sample_axial"]


# --------------------------------------------------------------------------------------------
# Transolver family (transolver.py, linear_no.py, gale.py)


def perturb_params(rng, params, skip=("temperature",)):
    """Add ``0.3 N(0, 1)`` to every parameter except the temperatures (in place; returns ``params``)."""
    for k in params:
        if k not in skip and not k.startswith("temperature"):
            params[k] = np.asarray(params[k] + 0.3 * rng.standard_normal(params[k].shape))
    return params


def slice_sizes(rng, size):
    """``(N, C, H, D, G)`` of a tiny / small sample (``G`` is LinearNO's ``key_ratio`` there)."""
    if size == "tiny":
        return int(rng.integers(3, 5)), 3, 2, 2, 3   # N, C, H, D, G
    return int(rng.integers(8, 14)), 6, 2, 3, 4


def check_point_permutation(fwd, sample):
    """Check factory: permuting the points of ``x`` permutes the output rows (other inputs fixed)."""
    def check(rng):
        s = sample(rng, "small")
        out = fwd(**s.inputs, params=s.params, **s.config)[0]
        perm = rng.permutation(s.inputs["x"].shape[1])
        out_p = fwd(**dict(s.inputs, x=s.inputs["x"][:, perm]), params=s.params, **s.config)[0]
        err = float(np.abs(out_p - out[:, perm]).max())
        assert err < 1e-12, f"not permutation-equivariant over points: {err}"
        return err
    return check


def check_uniform_refinement(fwd, sample, **extra):
    """Check factory: repeating every point 3 times leaves every output unchanged.

    Slice tokens are weighted point averages (and LinearNO's key softmax over points is
    normalised too): repeating every point k times, a uniform refinement of a piecewise-constant
    function, leaves every output unchanged (Transolver: exactly when slice_eps = 0; with the
    upstream 1e-5 the change is O(eps / N)).
    """
    def check(rng):
        s = sample(rng, "small")
        cfg = dict(s.config, **extra)
        out = fwd(**s.inputs, params=s.params, **cfg)[0]
        inp = dict(s.inputs, x=np.repeat(s.inputs["x"], 3, axis=1))
        out3 = fwd(**inp, params=s.params, **cfg)[0]
        err = float(np.abs(out3[:, ::3] - out).max())
        assert err < 1e-12, f"uniform refinement changes the output: {err}"
        return err
    return check


# --------------------------------------------------------------------------------------------
# Axial kernels (factformer.py, ifactformer.py)


def check_conv1x1_matches_linear(layer, init_params, rng):
    """A slice-front layer on a structured mesh with 1x1 conv projections equals the same layer on
    the irregular mesh with the equivalent Linear projections (``layer(x, params, n_head=, mesh_shape=)``,
    ``init_params(rng, dim, n_head, dim_head, slice_num, mesh_ndim=, kernel=)``). Returns the error."""
    p = init_params(rng, 3, 2, 2, 3, mesh_ndim=2, kernel=1)
    lin = {**p, **{f"in_project_{t}.weight": p[f"in_project_{t}.weight"][:, :, 0, 0].T for t in ("x", "fx")}}
    x = rng.standard_normal((2, 12, 3))
    err = float(np.abs(layer(x, p, n_head=2, mesh_shape=(3, 4)) - layer(x, lin, n_head=2)).max())
    assert err < 1e-13, f"1x1 conv projections differ from the Linear ones: {err:.2e}"
    return err


def sample_axial(rng, size, **config):
    """``v, q_x, k_x, q_y, k_y`` of a FactFormer-style axial core, scales 0.7 / 1.3, plus ``config``."""
    if size == "tiny":
        b, h, nx, ny, c, d = 2, 1, int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 2
    else:
        b, h, nx, ny, c, d = 2, 2, int(rng.integers(4, 7)), int(rng.integers(4, 8)), 3, 4
    return Sample(inputs={"v": rng.standard_normal((b, h, nx, ny, c)),
                          "q_x": rng.standard_normal((b, h, nx, d)), "k_x": rng.standard_normal((b, h, nx, d)),
                          "q_y": rng.standard_normal((b, h, ny, d)), "k_y": rng.standard_normal((b, h, ny, d))},
                  config={"scaling_x": 0.7, "scaling_y": 1.3, **config})
