r"""Low-rank factorised linear layer (LED unit of the Low-Rank Transformer), with SVD initialisation.

Winata, Cahyawijaya, Lin, Liu, Fung, "Lightweight and Efficient End-to-End Speech Recognition
Using Low-Rank Transformer", ICASSP 2020, arXiv 1910.13923; generalised to whole models in
Cahyawijaya, "Greenformers: Improving Computation and Memory Efficiency in Transformer Models via
Low-Rank Approximation", arXiv 2108.10808 (2021). Upstream: SamuelCahyawijaya/greenformer
``src/py_auto_fact/lr_module.py`` (``LED``) @ 2f81f96975e698e29fed4785554d7e859c49a29d and
``src/py_auto_fact/auto_fact.py`` (``factorize_module``, ``linear_svd``) @
006609beb158ba3db5f4700e03daf9537b446b9a.

Forward
-------
A dense $W\in\mathbb R^{d_{in}\times d_{out}}$ is replaced by the product of an encoder
$E\in\mathbb R^{d_{in}\times r}$ (``"led_unit.0.weight"``, bias-free) and a decoder
$D\in\mathbb R^{r\times d_{out}}$ (``"led_unit.1.weight"``, optional bias ``"led_unit.1.bias"``),
upstream's ``nn.Sequential(Linear(d_in, r, bias=False), Linear(r, d_out))``:

$$h = xE,\qquad y = hD + b.$$

Parameters drop from $d_{in}d_{out}$ to $r(d_{in}+d_{out})$; the cost per token likewise. The
rank $r$ is read from the weights.

Backward
--------
$dD = h^\top dy$, $db = \sum dy$, $dh = dy\,D^\top$, $dE = x^\top dh$, $dx = dh\,E^\top$ (sums
over every leading axis): two chained linear VJPs (`refattn.nn.linear.linear_prefixed_vjp`).

Initialisation from a dense layer
---------------------------------
`low_rank_from_dense` is Greenformer's ``solver="svd"``: with $W = U\Sigma V^\top$ the encoder is
$(U\Sigma)_{:, :r}$, the decoder $V^\top_{:r}$, the bias copied. Upstream calls the randomised
``torch.svd_lowrank(W, q=r, niter=10)``; here the SVD is exact (``numpy.linalg.svd``), which is
the limit the randomised solver approximates. By Eckart–Young this is the best rank-$r$
approximation in Frobenius and spectral norm; with $r = \min(d_{in}, d_{out})$ it reproduces $W$
exactly (checks ``full_rank_is_exact``, ``eckart_young``). Greenformer's ``rank < 1`` (a fraction
of $\min(d_{in}, d_{out})$) and its NMF/SNMF solvers are not reproduced.

Agreement with upstream
-----------------------
``LED`` run in float64 on CPU on $x\in\mathbb R^{2\times5\times7}$, $d_{out}=6$, $r=3$ (with and
without bias): output and the gradients of $x$ and all weights agree to $1.3\times10^{-15}$
absolute. ``auto_fact.py`` imports the ``matrix_fact`` package (not installed), so its
``linear_svd`` was transcribed into the scratch script: at full rank $r=6$ on an
``nn.Linear(7, 6)`` weight, its product $ED$ and `low_rank_from_dense`'s agree with each other
to $4.4\times10^{-16}$ and with $W$ to $6.7\times10^{-16}$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ..nn.linear import linear_prefixed, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["low_rank_linear_forward", "low_rank_linear_backward", "low_rank_linear", "low_rank_from_dense"]

_ENC, _DEC = "led_unit.0", "led_unit.1"


def _dims(params):
    if not isinstance(params, dict):
        raise TypeError(f"params for low_rank_linear must be a dict of arrays; got {type(params).__name__}")
    for key in (f"{_ENC}.weight", f"{_DEC}.weight"):
        if params.get(key) is None:
            raise ValueError(f"params is missing key {key!r} for low_rank_linear")
    e = as_float(params[f"{_ENC}.weight"], f"{_ENC}.weight")
    d = as_float(params[f"{_DEC}.weight"], f"{_DEC}.weight")
    if e.ndim != 2 or d.ndim != 2:
        raise ValueError(f"{_ENC}.weight must have shape (d_in, r) and {_DEC}.weight (r, d_out); "
                         f"got {e.shape} and {d.shape}")
    return e.shape[0], e.shape[1], d.shape[1]


def low_rank_linear_forward(x, params):
    r"""$y = (xE)D + b$ (module docstring).

    Parameters
    ----------
    x : array (..., d_in)
    params : dict
        ``"led_unit.0.weight" (d_in, r)``, ``"led_unit.1.weight" (r, d_out)`` and optional
        ``"led_unit.1.bias" (d_out,)`` (upstream names; weights stored ``(in, out)`` = torch ``weight.T``).

    Returns
    -------
    y, cache
        ``y`` of shape ``(..., d_out)``.
    """
    x = as_float(x, "x", min_ndim=1)
    d_in, r, d_out = _dims(params)
    spec = {f"{_ENC}.weight": (x.shape[-1], r), f"{_DEC}.weight": (r, d_out), f"{_DEC}.bias": (d_out,)}
    p = check_params(params, spec, optional=(f"{_DEC}.bias",), where="low_rank_linear")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    h = linear_prefixed(p, _ENC, x)
    y = linear_prefixed(p, _DEC, h)
    return y, {"x": x, "h": h, "p": p, "shape": y.shape}


def low_rank_linear_backward(dout, cache):
    r"""Gradients of `low_rank_linear_forward` for ``x`` and every params key (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["x"].dtype)
    grads = {}
    dh = linear_prefixed_vjp(grads, cache["p"], _DEC, g, cache["h"])
    grads["x"] = linear_prefixed_vjp(grads, cache["p"], _ENC, dh, cache["x"])
    return grads


def low_rank_linear(x, params) -> np.ndarray:
    """Convenience wrapper: the output of `low_rank_linear_forward`."""
    return low_rank_linear_forward(x, params)[0]


def low_rank_from_dense(weight, rank: int, bias=None) -> dict:
    r"""LED params approximating the dense layer ``x @ weight + bias`` at rank ``rank`` by a truncated
    SVD (Greenformer's ``solver="svd"``, exact SVD): encoder $(U\Sigma)_{:, :r}$, decoder $V^\top_{:r}$.

    ``weight`` is ``(d_in, d_out)`` (torch ``weight.T``); ``rank`` at most ``min(d_in, d_out)``.
    """
    w = as_float(weight, "weight", min_ndim=2)
    if w.ndim != 2:
        raise ValueError(f"weight must have shape (d_in, d_out); got {w.shape}")
    r = check_int(rank, "rank", minimum=1)
    if r > min(w.shape):
        raise ValueError(f"rank must be at most min(d_in, d_out) = {min(w.shape)}; got {r}")
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    out = {f"{_ENC}.weight": u[:, :r] * s[:r], f"{_DEC}.weight": vt[:r].copy()}
    if bias is not None:
        b = as_float(bias, "bias")
        if b.shape != (w.shape[1],):
            raise ValueError(f"bias must have shape ({w.shape[1]},); got {b.shape}")
        out[f"{_DEC}.bias"] = b.copy()
    return out


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        d_in, r, d_out, n = 3, 2, 3, 2
    else:
        d_in, r, d_out, n = 8, 3, 6, 5
    p = {f"{_ENC}.weight": rng.standard_normal((d_in, r)) / np.sqrt(d_in),
         f"{_DEC}.weight": rng.standard_normal((r, d_out)) / np.sqrt(r)}
    if rng.random() < 0.7:
        p[f"{_DEC}.bias"] = 0.2 * rng.standard_normal(d_out)
    return Sample(inputs={"x": rng.standard_normal((2, n, d_in))}, params=p)


def _reference(x, params):
    # The collapsed dense layer x @ (E D) + b.
    w = params[f"{_ENC}.weight"] @ params[f"{_DEC}.weight"]
    return x @ w + params.get(f"{_DEC}.bias", 0.0)


def _check_full_rank_is_exact(rng):
    # The catalogue's fit test: rank min(d_in, d_out) represents any dense matrix exactly.
    err = 0.0
    for d_in, d_out in ((5, 3), (3, 5), (4, 4)):
        w, b = rng.standard_normal((d_in, d_out)), rng.standard_normal(d_out)
        x = rng.standard_normal((2, 3, d_in))
        y = low_rank_linear(x, low_rank_from_dense(w, min(d_in, d_out), b))
        err = max(err, float(np.abs(y - (x @ w + b)).max()))
    assert err < 1e-12, f"full-rank LED differs from the dense layer by {err}"
    return err


def _check_eckart_young(rng):
    # Truncated SVD is the best rank-r fit: its Frobenius error is sqrt(sum of the dropped
    # sigma^2) and no random rank-r factorisation does better.
    w = rng.standard_normal((7, 5))
    s = np.linalg.svd(w, compute_uv=False)
    p = low_rank_from_dense(w, 2)
    got = np.linalg.norm(w - p[f"{_ENC}.weight"] @ p[f"{_DEC}.weight"])
    err = abs(got - np.sqrt(np.sum(s[2:] ** 2)))
    assert err < 1e-12, f"truncated SVD error {got} is not the tail energy: {err}"
    for _ in range(20):
        q = rng.standard_normal((7, 2)) @ rng.standard_normal((2, 5))
        assert np.linalg.norm(w - q) >= got - 1e-12
    return float(err)


register(
    Mechanism(
        slug="low_rank_factorized_linear", family="5-building-blocks", tier="T2",
        official_code="SamuelCahyawijaya/greenformer src/py_auto_fact/lr_module.py@2f81f96 (LED)",
        title="Low-rank factorised linear layer y = (xE)D + b (LED unit), with truncated-SVD initialisation",
        paper="Winata, Cahyawijaya, Lin, Liu, Fung, Lightweight and Efficient End-to-End Speech Recognition Using "
              "Low-Rank Transformer, ICASSP 2020, arXiv 1910.13923",
        forward=low_rank_linear_forward, backward=low_rank_linear_backward, sample=_sample, reference=_reference,
        docs="blocks/residual-and-linear.md#low-rank-factorised-linear-layer",
        checks={"full_rank_is_exact": _check_full_rank_is_exact, "eckart_young": _check_eckart_young},
    ),
)
