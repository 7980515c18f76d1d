r"""Differential Mamba: two whole Mamba blocks subtracted with a DIFF-style λ, then RMSNorm.

Schneider, Zimerman, Nachmani, "Differential Mamba", AACL 2025, arXiv 2507.06204. Official code:
NadavSc/Diff-Mamba ``language_modeling/src/models/sequence/modules/diffmambablock.py``
@ 60c141e700db69a2ec427cf6b84ba7fa4d027908 (class ``DiffMamba``, Mamba-1 blocks; the repository
also has Mamba-2 and S6-level variants, not implemented here).

Forward
-------
Each branch $m\in\{1, 2\}$ is a complete Mamba-1 mixer (upstream's ``Mamba`` class, slow path) on
$X\in\mathbb R^{B\times L\times C}$, with $D_i$ inner channels, $N$ states, rank $R$ and kernel $K$:

$$[x, z] = XW_{in}\ (+b_{in}),\qquad u = \mathrm{SiLU}(\mathrm{conv}_K(x) + b_{conv})\ \text{(depthwise, causal)},$$

$$[\delta_r, B, C] = uW_x,\quad \delta = \delta_rW_{dt},\quad A = -e^{A_{\log}},\quad
y = \mathrm{S6}(u, \delta, A, B, C, D, z;\ \beta = b_{dt},\ \text{softplus}),\quad M_m(X) = yW_{out}\ (+b_{out}),$$

S6 being the selective scan of :mod:`refattn.operators.mamba` (``selective_scan_forward``, Euler
$\bar B$ as upstream's ``selective_scan_fn``), reused, not re-implemented. The block output is

$$\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init},\qquad
Y = (1-\lambda_{init})\,\mathrm{RMSNorm}\bigl(M_1(X) - \lambda M_2(X)\bigr)\odot w ,$$

with λ vectors of length $N$ (``d_state``), RMSNorm over the model width $C$ (eps $10^{-5}$,
affine ``subln.weight``) and $\lambda_{init} = 0.8 - 0.6\,e^{-0.3(i-1)}$ in upstream's layer
index $i$ (the ``"motif"`` convention of `lambda_init_fn`, the default here).

Backward (derivation)
---------------------
With $G = \partial L/\partial Y$ and $a = M_1 - \lambda M_2$: $g_a$ is the RMSNorm VJP of
$(1-\lambda_{init})G$ (`subln_backward`); $dM_1 = g_a$, $dM_2 = -\lambda g_a$,
$d\lambda = -\sum g_a\odot M_2$, then `lambda_reparam_backward`. Inside a branch, in reverse:
$dW_{out} = y^\top dM$, $dy = dM\,W_{out}^\top$; the selective-scan backward through time
(``selective_scan_backward``) gives $du, d\delta, dA, dB, dC, dD, dz, d\beta$; $dA_{\log} = dA\odot A$
(from $A = -e^{A_{\log}}$); $dW_{dt} = \delta_r^\top d\delta$, $d\delta_r = d\delta\,W_{dt}^\top$;
$dW_x = u^\top[d\delta_r, dB, dC]$ and $du \mathrel{+}= [d\delta_r, dB, dC]W_x^\top$; the SiLU VJP;
the depthwise causal convolution VJP (:func:`refattn.nn.conv.conv_vjp`, left padding $K-1$, which
equals upstream's symmetric padding followed by ``[..., :L]``); $dX = \sum_m [dx, dz]_mW_{in,m}^\top$.

Conventions (keywords)
----------------------
* ``depth`` / ``lambda_init`` / ``lambda_init_convention`` as the V1 layer; upstream's formula in
  its ``i_layer`` is the ``"motif"`` convention (default).
* ``scale_by_lambda_init`` (default True, upstream ``attn * (1 - lambda_init)``).
* ``eps`` of the RMSNorm (upstream 1e-5); ``mode``/``chunk_size`` of the scan.
* Parameter keys are upstream's module paths: ``m1.in_proj.weight`` ... ``m2.out_proj.weight``,
  ``lambda_q1 .. lambda_k2``, ``subln.weight``; weights ``(in, out)`` (torch ``weight.T``), the
  convolution keeps torch's ``(D_i, 1, K)``. ``in_proj.bias`` / ``out_proj.bias`` optional
  (upstream ``bias=False``), ``conv1d.bias`` optional (upstream ``conv_bias=True``).
* Upstream computes the scan in float32; refattn keeps float64.

Measured agreement with upstream (float64, CPU): the ``DiffMamba`` forward transcribed line by line
into torch (``mamba_ssm``'s CUDA scan replaced by its own ``selective_scan_ref``; ``mamba_ssm``
and ``causal_conv1d`` are CUDA packages) with upstream's parameter initialisation, B=2, L=7,
C=8, expand=2, N=4, K=4, layer 3, chunked and recurrent scans: output max abs error 3.9e-16,
every one of the 23 parameter gradients and dX max rel error <= 1.0e-15 (see ``docs/differential/t3.md#diff_mamba``).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.activations import silu, silu_grad
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ...operators.mamba import selective_scan_backward, selective_scan_forward
from ...registry import Mechanism, Sample, register
from .layer import (
    V1_LAMBDA_KEYS,
    lambda_reparam_backward,
    lambda_reparam_forward,
    resolve_lambda_init,
    subln_backward,
    subln_forward,
)

__all__ = [
    "diff_mamba_forward",
    "diff_mamba_backward",
    "diff_mamba",
    "init_diff_mamba_params",
]

_BRANCHES = ("m1", "m2")


def _spec(c, di, n, r, k, bias):
    spec = {}
    for m in _BRANCHES:
        spec.update(linear_prefixed_spec(f"{m}.in_proj", c, 2 * di, bias=True))
        spec.update({f"{m}.conv1d.weight": (di, 1, k), f"{m}.conv1d.bias": (di,),
                     f"{m}.x_proj.weight": (di, r + 2 * n), f"{m}.dt_proj.weight": (r, di),
                     f"{m}.dt_proj.bias": (di,), f"{m}.A_log": (di, n), f"{m}.D": (di,)})
        spec.update(linear_prefixed_spec(f"{m}.out_proj", di, c, bias=True))
    spec.update({key: (n,) for key in V1_LAMBDA_KEYS})
    spec["subln.weight"] = (c,)
    return spec


def _validate(x, params, eps, mode, chunk_size):
    x = as_float(x, "x", ndim=3)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    for key in ("m1.in_proj.weight", "m1.conv1d.weight", "m1.A_log", "m1.dt_proj.weight"):
        if key not in params:
            raise ValueError(f"params is missing {key!r} (Diff-Mamba keys: m1./m2. Mamba blocks, lambda_*, subln.weight)")
    c = x.shape[2]
    check_weight_in(params, "m1.in_proj.weight", c, input_name="x")
    w_in = as_float(params["m1.in_proj.weight"], "m1.in_proj.weight", ndim=2)
    if w_in.shape[0] != c or w_in.shape[1] % 2:
        raise ValueError(f"m1.in_proj.weight must have shape (C={c}, 2*d_inner); got {w_in.shape}")
    di = w_in.shape[1] // 2
    k = as_float(params["m1.conv1d.weight"], "m1.conv1d.weight", ndim=3).shape[2]
    n = as_float(params["m1.A_log"], "m1.A_log", ndim=2).shape[1]
    w_dt = as_float(params["m1.dt_proj.weight"], "m1.dt_proj.weight", ndim=2).shape
    if w_dt[1] != di:  # (R, D_i): R is read off its input axis, so check the output axis first
        hint = (f" (PyTorch's nn.Linear.weight is (out, in): pass its transpose, of shape {w_dt[::-1]})"
                if w_dt[0] == di else "")
        raise ValueError(f"m1.dt_proj.weight must have shape (dt_rank, d_inner={di}) (refattn weights are (in, out); "
                         f"d_inner from m1.in_proj.weight); got {w_dt}{hint}")
    r = w_dt[0]
    optional = tuple(f"{m}.{p}.bias" for m in _BRANCHES for p in ("in_proj", "out_proj", "conv1d"))
    p = check_params(params, _spec(c, di, n, r, k, True), optional=optional, where="diff_mamba")
    check_positive(eps, "eps")
    check_choice(mode, "mode", ("chunked", "recurrent"))
    check_int(chunk_size, "chunk_size", minimum=1)
    dt = compute_dtype(x, *p.values())
    arrays = cast_all(dt, {"x": x, **p})
    return arrays.pop("x"), arrays, (di, n, r, k)


def _mamba_forward(x, p, m, dims, mode, chunk_size):
    """One upstream ``Mamba`` mixer (slow path) on x (B, L, C); returns its output and a cache."""
    di, n, r, k = dims
    xz = linear_prefixed(p, f"{m}.in_proj", x)                              # (B, L, 2 Di)
    xi, z = np.swapaxes(xz[..., :di], 1, 2), np.swapaxes(xz[..., di:], 1, 2)  # (B, Di, L)
    pads = ((k - 1, 0),)
    pre = conv_apply(xi, p[f"{m}.conv1d.weight"], p.get(f"{m}.conv1d.bias"), padding=pads, groups=di)
    u = silu(pre)
    ut = np.swapaxes(u, 1, 2)                                               # (B, L, Di)
    xdbl = ut @ p[f"{m}.x_proj.weight"]
    dtr, bm, cm = xdbl[..., :r], xdbl[..., r:r + n], xdbl[..., r + n:]
    delta = np.swapaxes(dtr @ p[f"{m}.dt_proj.weight"], 1, 2)               # (B, Di, L)
    A = -np.exp(p[f"{m}.A_log"])
    y, scan = selective_scan_forward(u, delta, A, np.swapaxes(bm, 1, 2), np.swapaxes(cm, 1, 2),
                                     p[f"{m}.D"], z, p[f"{m}.dt_proj.bias"], delta_softplus=True,
                                     mode=mode, chunk_size=chunk_size)
    yt = np.swapaxes(y, 1, 2)
    out = linear_prefixed(p, f"{m}.out_proj", yt)
    return out, dict(xi=xi, pre=pre, ut=ut, dtr=dtr, A=A, scan=scan, yt=yt)


def _mamba_backward(g, c, p, m, x, dims, grads):
    """VJP of :func:`_mamba_forward`: fills ``grads`` with the branch's parameter gradients, returns dX."""
    di, n, r, k = dims
    dyt = linear_prefixed_vjp(grads, p, f"{m}.out_proj", g, c["yt"])
    gs = selective_scan_backward(np.swapaxes(dyt, 1, 2), c["scan"])
    grads[f"{m}.A_log"] = gs["A"] * c["A"]
    grads[f"{m}.D"] = gs["D"]
    grads[f"{m}.dt_proj.bias"] = gs["delta_bias"]
    ddelta = np.swapaxes(gs["delta"], 1, 2)                                 # (B, L, Di)
    w_dt = p[f"{m}.dt_proj.weight"]
    grads[f"{m}.dt_proj.weight"] = c["dtr"].reshape(-1, r).T @ ddelta.reshape(-1, di)
    dxdbl = np.concatenate([ddelta @ w_dt.T, np.swapaxes(gs["B"], 1, 2), np.swapaxes(gs["C"], 1, 2)], axis=-1)
    w_x = p[f"{m}.x_proj.weight"]
    grads[f"{m}.x_proj.weight"] = c["ut"].reshape(-1, di).T @ dxdbl.reshape(-1, r + 2 * n)
    du = gs["u"] + np.swapaxes(dxdbl @ w_x.T, 1, 2)
    dpre = du * silu_grad(c["pre"])
    conv_bias = f"{m}.conv1d.bias" in p
    gc = conv_vjp(dpre, c["xi"], p[f"{m}.conv1d.weight"], padding=((k - 1, 0),), groups=di, has_bias=conv_bias)
    grads[f"{m}.conv1d.weight"] = gc["weight"]
    if conv_bias:
        grads[f"{m}.conv1d.bias"] = gc["bias"]
    dxz = np.concatenate([np.swapaxes(gc["x"], 1, 2), np.swapaxes(gs["z"], 1, 2)], axis=-1)
    return linear_prefixed_vjp(grads, p, f"{m}.in_proj", dxz, x)


def diff_mamba_forward(x, params, *, depth=None, lambda_init=None, lambda_init_convention: str = "motif",
                       scale_by_lambda_init: bool = True, eps: float = 1e-5, mode: str = "chunked",
                       chunk_size: int = 64):
    r"""Differential Mamba block $Y = (1-\lambda_{init})\,\mathrm{RMSNorm}(M_1(X) - \lambda M_2(X))$.

    Parameters
    ----------
    x : array (B, L, C)
        Input sequence.
    params : dict
        Two Mamba-1 blocks under ``m1.`` / ``m2.`` (``in_proj.weight (C, 2 D_i)``,
        ``conv1d.weight (D_i, 1, K)``, ``conv1d.bias (D_i,)``, ``x_proj.weight (D_i, R + 2N)``,
        ``dt_proj.weight (R, D_i)``, ``dt_proj.bias (D_i,)``, ``A_log (D_i, N)``, ``D (D_i,)``,
        ``out_proj.weight (D_i, C)``, optional ``in_proj.bias`` / ``out_proj.bias``; ``conv1d.bias`` is
        absent for upstream's ``conv_bias=False``), the λ vectors
        ``lambda_q1, lambda_k1, lambda_q2, lambda_k2 (N,)`` and ``subln.weight (C,)``.
    depth, lambda_init, lambda_init_convention
        $\lambda_{init}$ from a layer index (upstream: $0.8 - 0.6e^{-0.3(i-1)}$, convention
        ``"motif"``) or a fixed value (exactly one of ``depth``/``lambda_init``).
    scale_by_lambda_init : bool
        Multiply by $(1-\lambda_{init})$ after the norm (upstream).
    eps : float
        RMSNorm epsilon (upstream 1e-5).
    mode, chunk_size
        Selective-scan form (:func:`refattn.operators.mamba.selective_scan_forward`).

    Returns
    -------
    out (B, L, C), cache
    """
    x, p, dims = _validate(x, params, eps, mode, chunk_size)
    lam_init = resolve_lambda_init(depth, lambda_init, lambda_init_convention)
    if not isinstance(scale_by_lambda_init, (bool, np.bool_)):
        raise TypeError(f"scale_by_lambda_init must be a bool; got {type(scale_by_lambda_init).__name__}")
    outs, caches = [], []
    for m in _BRANCHES:
        o, c = _mamba_forward(x, p, m, dims, mode, chunk_size)
        outs.append(o)
        caches.append(c)
    lam, lam_saved = lambda_reparam_forward(*(p[key] for key in V1_LAMBDA_KEYS), lam_init)
    a = outs[0] - lam * outs[1]
    y, norm_saved = subln_forward(a, p["subln.weight"], None, eps)
    factor = (1.0 - lam_init) if scale_by_lambda_init else 1.0
    out = y * factor
    cache = dict(x=x, p=p, dims=dims, caches=caches, o2=outs[1], lam=lam, lam_saved=lam_saved,
                 norm_saved=norm_saved, factor=factor, out_shape=out.shape)
    return out, cache


def diff_mamba_backward(dout, cache):
    """Gradients of :func:`diff_mamba_forward` for ``x`` and every parameter (module docstring)."""
    x, p = cache["x"], cache["p"]
    g = as_dout(dout, cache["out_shape"], x.dtype) * cache["factor"]
    ga, dw, _ = subln_backward(g, cache["norm_saved"], p["subln.weight"])
    grads = {"subln.weight": dw}
    dlam = -np.sum(ga * cache["o2"])
    grads.update(lambda_reparam_backward(dlam, *(p[key] for key in V1_LAMBDA_KEYS), cache["lam_saved"]))
    dx = _mamba_backward(ga, cache["caches"][0], p, "m1", x, cache["dims"], grads)
    dx = dx + _mamba_backward(-cache["lam"] * ga, cache["caches"][1], p, "m2", x, cache["dims"], grads)
    return {"x": dx, **grads}


def diff_mamba(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diff_mamba_forward`."""
    return diff_mamba_forward(x, params, **config)[0]


def init_diff_mamba_params(rng, d_model: int, *, d_state: int = 16, d_conv: int = 4, expand: int = 1,
                           dt_rank="auto", dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4,
                           bias: bool = False) -> dict:
    r"""Upstream's initialisation: ``nn.Linear``/``nn.Conv1d`` defaults, ``dt_proj.weight``
    $U(\pm R^{-1/2})$, ``dt_proj.bias`` the inverse softplus of $\Delta\sim\log U(dt_{min}, dt_{max})$
    (floored), $A_{\log} = \log(1..N)$, $D = 1$, λ vectors $\mathcal N(0, 1)$, ``subln.weight`` 1
    (``DiffMamba`` defaults: ``expand=1``, ``d_state=16``, ``d_conv=4``)."""
    d_model = check_int(d_model, "d_model", minimum=1)
    di = int(expand * d_model)
    r = math.ceil(d_model / 16) if dt_rank == "auto" else check_int(dt_rank, "dt_rank", minimum=1)
    p = {}
    for m in _BRANCHES:
        p.update(init_linear_prefixed(rng, d_model, 2 * di, f"{m}.in_proj", bias=bias))
        bound = 1.0 / math.sqrt(d_conv)
        p[f"{m}.conv1d.weight"] = rng.uniform(-bound, bound, (di, 1, d_conv))
        p[f"{m}.conv1d.bias"] = rng.uniform(-bound, bound, di)
        p[f"{m}.x_proj.weight"] = init_linear_prefixed(rng, di, r + 2 * d_state, "w", bias=False)["w.weight"]
        p[f"{m}.dt_proj.weight"] = rng.uniform(-r ** -0.5, r ** -0.5, (r, di))
        dt = np.maximum(np.exp(rng.uniform(math.log(dt_min), math.log(dt_max), di)), dt_init_floor)
        p[f"{m}.dt_proj.bias"] = dt + np.log(-np.expm1(-dt))
        p[f"{m}.A_log"] = np.log(np.tile(np.arange(1, d_state + 1, dtype=float), (di, 1)))
        p[f"{m}.D"] = np.ones(di)
        p.update(init_linear_prefixed(rng, di, d_model, f"{m}.out_proj", bias=bias))
    for key in V1_LAMBDA_KEYS:
        p[key] = rng.standard_normal(d_state)
    p["subln.weight"] = np.ones(d_model)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw_params(rng, c, di, n, r, k, bias=False):
    p = {}
    for m in _BRANCHES:
        p[f"{m}.in_proj.weight"] = rng.standard_normal((c, 2 * di)) / math.sqrt(c)
        p[f"{m}.conv1d.weight"] = 0.6 * rng.standard_normal((di, 1, k))
        p[f"{m}.conv1d.bias"] = 0.2 * rng.standard_normal(di)
        p[f"{m}.x_proj.weight"] = rng.standard_normal((di, r + 2 * n)) / math.sqrt(di)
        p[f"{m}.dt_proj.weight"] = 0.5 * rng.standard_normal((r, di))
        p[f"{m}.dt_proj.bias"] = rng.uniform(-2.0, -0.5, di)
        p[f"{m}.A_log"] = 0.3 * rng.standard_normal((di, n))
        p[f"{m}.D"] = rng.standard_normal(di)
        p[f"{m}.out_proj.weight"] = rng.standard_normal((di, c)) / math.sqrt(di)
        if bias:
            p[f"{m}.in_proj.bias"] = 0.1 * rng.standard_normal(2 * di)
            p[f"{m}.out_proj.bias"] = 0.1 * rng.standard_normal(c)
    while True:   # keep lambda away from making M1 - lambda M2 tiny (RMSNorm near-kink)
        vec = 0.4 * rng.standard_normal((4, n))
        if abs(np.exp(vec[0] @ vec[1]) - np.exp(vec[2] @ vec[3])) < 0.6:
            break
    p.update(dict(zip(V1_LAMBDA_KEYS, vec)))
    p["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(c)
    return p


def _sample(rng, size):
    if size == "tiny":
        b, n_t, c, di, n, r, k = 2, 3, 2, 2, 2, 1, 2
    else:
        b, n_t, c, di, n, r, k = 2, int(rng.integers(5, 9)), 4, 6, 3, 2, 3
    p = _draw_params(rng, c, di, n, r, k, bias=bool(rng.integers(2)))
    if rng.random() < 0.3:  # upstream's conv_bias=False
        for m in _BRANCHES:
            del p[f"{m}.conv1d.bias"]
    return Sample(inputs={"x": rng.standard_normal((b, n_t, c))}, params=p,
                  config={"depth": int(rng.integers(1, 6)), "mode": str(rng.choice(["chunked", "recurrent"])),
                          "chunk_size": 2})


def _reference(x, params, *, depth=None, lambda_init=None, lambda_init_convention="motif",
               scale_by_lambda_init=True, eps=1e-5, mode="chunked", chunk_size=64):
    # Every step written out: explicit causal conv loop and the time loop of selective_scan_ref.
    lam_init = resolve_lambda_init(depth, lambda_init, lambda_init_convention)

    def block(m):
        P = {key[len(m) + 1:]: v for key, v in params.items() if key.startswith(m + ".")}
        di = P["in_proj.weight"].shape[1] // 2
        xz = x @ P["in_proj.weight"] + P.get("in_proj.bias", 0.0)
        xi, z = xz[..., :di], xz[..., di:]
        w = P["conv1d.weight"][:, 0]
        kk = w.shape[1]
        pad = np.concatenate([np.zeros((x.shape[0], kk - 1, di)), xi], axis=1)
        u = sum(w[:, j] * pad[:, j:j + x.shape[1]] for j in range(kk)) + P.get("conv1d.bias", 0.0)
        u = u / (1.0 + np.exp(-u))
        r, n = P["dt_proj.weight"].shape[0], P["A_log"].shape[1]
        xd = u @ P["x_proj.weight"]
        dlt = np.log1p(np.exp(xd[..., :r] @ P["dt_proj.weight"] + P["dt_proj.bias"]))
        A = -np.exp(P["A_log"])
        h = np.zeros((x.shape[0], di, n))
        ys = []
        for t in range(x.shape[1]):
            h = np.exp(dlt[:, t, :, None] * A) * h + dlt[:, t, :, None] * xd[:, t, None, r:r + n] * u[:, t, :, None]
            ys.append(np.sum(h * xd[:, t, None, r + n:], axis=-1) + P["D"] * u[:, t])
        y = np.stack(ys, axis=1) * z / (1.0 + np.exp(-z))
        return y @ P["out_proj.weight"] + P.get("out_proj.bias", 0.0)

    lq1, lk1, lq2, lk2 = (params[key] for key in V1_LAMBDA_KEYS)
    lam = np.exp(lq1 @ lk1) - np.exp(lq2 @ lk2) + lam_init
    a = block("m1") - lam * block("m2")
    y = a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + eps) * params["subln.weight"]
    return y * (1.0 - lam_init) if scale_by_lambda_init else y


def _check_causal(rng):
    # Every piece (causal conv, forward scan, per-position norm) is causal: a change at the last
    # position leaves every earlier output untouched.
    s = _sample(rng, "small")
    out = diff_mamba(s.inputs["x"], s.params, **s.config)
    x2 = s.inputs["x"].copy()
    x2[:, -1] += 1.0
    err = float(np.abs(diff_mamba(x2, s.params, **s.config)[:, :-1] - out[:, :-1]).max())
    assert err < 1e-13, f"Diff-Mamba leaks the future by {err:.2e}"
    return err


def _check_identical_branches(rng):
    # With m2 = m1 the block is (1 - lambda_init) RMSNorm((1 - lambda) M(X)): up to the sign of
    # (1 - lambda) the output does not depend on lambda (the norm removes the scale; eps ~ 0).
    s = _sample(rng, "small")
    s.config["eps"] = 1e-30
    p = dict(s.params)
    for key in list(p):
        if key.startswith("m2."):
            p[key] = p["m1." + key[3:]]
    out1 = diff_mamba(s.inputs["x"], p, **s.config)
    lam_init = resolve_lambda_init(s.config["depth"], None, "motif")
    for key in V1_LAMBDA_KEYS:
        p[key] = np.zeros_like(p[key])        # lambda = lambda_init, 1 - lambda > 0
    out0 = diff_mamba(s.inputs["x"], p, **s.config)
    lam1 = np.exp(s.params["lambda_q1"] @ s.params["lambda_k1"]) - np.exp(s.params["lambda_q2"] @ s.params["lambda_k2"]) + lam_init
    err = float(np.abs(out1 - np.sign(1.0 - lam1) * np.sign(1.0 - lam_init) * out0).max())
    assert err < 1e-10, f"identical branches: output depends on lambda beyond its sign ({err:.2e})"
    return err


register(
    Mechanism(
        slug="diff_mamba", family="2-differential", tier="T3",
        title="Differential Mamba",
        paper="Schneider, Zimerman, Nachmani, 'Differential Mamba', AACL 2025, arXiv 2507.06204",
        official_code="NadavSc/Diff-Mamba",
        forward=diff_mamba_forward, backward=diff_mamba_backward, sample=_sample, reference=_reference,
        docs="differential/t3.md#diff_mamba",
        checks={"causal": _check_causal, "identical_branches": _check_identical_branches},
    ),
)
