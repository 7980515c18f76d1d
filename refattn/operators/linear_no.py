r"""LinearNO: Transolver's Physics-Attention recast as canonical linear attention.

Paper: Hu, Liu, Qiao, Sun, Dou, "Transolver is a Linear Transformer: Revisiting
Physics-Attention through the Lens of Linear Attention", AAAI 2026, arXiv 2511.06294. Upstream:
HiPRL/LinearNO ``Standard_PDE_Benchmark/model/LinearAttnNeuralOperator.py`` (``LinearNO``,
``LinearNO_temp``; commit 3f2b80d).

Forward
-------
With $X_h$ the heads of ``in_project_x(x)`` (width $D$):

$$Y_h = \mathrm{softmax}_M(X_hW_q)\,\big[\mathrm{softmax}_N(X_hW_k)^\top X_hW_v\big],$$

``to_q``, ``to_k``: $D\to M$ (``key_ratio``, upstream class default 4), ``to_v``: $D\to D$, no
biases, shared by the heads; then ``to_out.0``. The first softmax runs over the $M$ features of
each point, the second over the $N$ points of each key column. Cost $O(NMD)$. Without its slice
attention (and with $\epsilon = 0$) Transolver is exactly this form with $\Phi_q = w$ and
$\Phi_k = \mathrm{softmax}_N(\log w)$ (check ``reproduces_transolver_without_slice_attention``).

Backward
--------
With $\Phi_q$, $\Phi_k$ and $S = \Phi_k^\top V$: $d\Phi_q = G S^\top$, $dS = \Phi_q^\top G$,
$d\Phi_k = V\,dS^\top$, $dV = \Phi_k\,dS$; the two softmax VJPs run along different axes (over
$M$ per point for $\Phi_q$, over the $N$ points per column for $\Phi_k$), with the temperature
VJP of Transolver (``tempered_softmax_backward`` in ``refattn.operators.common``) when
``use_temperature``; then the linear VJPs.

Conventions
-----------
* Upstream takes $V$ from the same ``x_mid`` as $Q, K$ (LinearNO#2 discusses the paper's separate
  value projection); refattn follows the code.
* ``use_temperature=True`` is ``LinearNO_temp``: logits divided by per-head ``temperature_q``,
  ``temperature_k`` clamped to ``tau_clamp`` (upstream ``(0.01, 1)``).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from ._samples import check_point_permutation, check_uniform_refinement, perturb_params, slice_sizes
from .common import check_head_width, check_tau_clamp, swap_last, tempered_softmax_backward, tempered_softmax_forward
from .transolver import transolver_init_params, transolver_physics_attention_forward

__all__ = [
    "linear_no_attention_forward",
    "linear_no_attention_backward",
    "linear_no_attention",
    "linear_no_init_params",
]


def _linear_no_spec(use_temperature):
    def spec(c, n_head, d, m):
        s = {"in_project_x.weight": (c, n_head * d), "in_project_x.bias": (n_head * d,),
             "to_q.weight": (d, m), "to_k.weight": (d, m), "to_v.weight": (d, d),
             "to_out.0.weight": (n_head * d, c), "to_out.0.bias": (c,)}
        if use_temperature:
            s["temperature_q"] = (n_head,)
            s["temperature_k"] = (n_head,)
        return s
    return spec


def linear_no_attention_forward(x, params, *, n_head: int, use_temperature: bool = False,
                                tau_clamp=(0.01, 1.0)):
    r"""LinearNO: $Y_h = \mathrm{softmax}_M(X_hW_q)\,[\mathrm{softmax}_N(X_hW_k)^\top X_hW_v]$.

    $X_h$ are the heads of ``in_project_x(x)``; $M$ = ``key_ratio`` (upstream class default 4).
    Cost $O(NMD)$.

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``in_project_x.weight`` (C, H D) and ``.bias``; ``to_q.weight`` (D, M),
        ``to_k.weight`` (D, M), ``to_v.weight`` (D, D) (no bias, shared by heads);
        ``to_out.0.weight`` (H D, C), ``to_out.0.bias``; with ``use_temperature`` also
        ``temperature_q``, ``temperature_k`` (H,) (upstream ``(1, H, 1, 1)``, init 0.5).
    use_temperature : bool
        Upstream ``LinearNO_temp``: the logits are divided by the per-head temperatures clamped
        to ``tau_clamp`` (upstream ``(0.01, 1)``). ``LinearNO`` (default) has none.

    Notes
    -----
    Upstream takes $V$ from the same ``x_mid`` as $Q, K$ (LinearNO#2 discusses the paper's
    separate value projection); refattn follows the code.

    Backward: with $A = \Phi_q$, $S = \Phi_k^\top V$, $dA = G S^\top$, $dS = A^\top G$,
    $d\Phi_k = V\,dS^\top$, $dV = \Phi_k\,dS$; the two softmax VJPs run along different axes
    (over $M$ per point for $\Phi_q$, over the $N$ points per column for $\Phi_k$).
    """
    if not isinstance(use_temperature, (bool, np.bool_)):
        raise TypeError(f"use_temperature must be a bool; got {type(use_temperature).__name__}")
    x = as_float(x, "x", ndim=3)
    n_head = check_int(n_head, "n_head", minimum=1)
    if not isinstance(params, dict) or params.get("to_q.weight") is None:
        raise ValueError("params must be a dict containing 'to_q.weight' of shape (dim_head, key_ratio)")
    check_head_width(params, "to_q.weight", x.shape[2], n_head)
    d, m = as_float(params["to_q.weight"], "to_q.weight", ndim=2).shape
    tau_clamp = check_tau_clamp(tau_clamp) if use_temperature else None
    p = check_params(params, _linear_no_spec(use_temperature)(x.shape[2], n_head, d, m))
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    xm = split_heads(linear_prefixed(p, "in_project_x", x), n_head)
    lq, lk, v = xm @ p["to_q.weight"], xm @ p["to_k.weight"], xm @ p["to_v.weight"]
    if use_temperature:
        phq, cq = tempered_softmax_forward(lq, p["temperature_q"], tau_clamp, -1)
        phk, ck = tempered_softmax_forward(lk, p["temperature_k"], tau_clamp, -2)
    else:
        (phq, _), (phk, _) = softmax_lse(lq, -1), softmax_lse(lk, -2)
        cq = ck = None
    s = swap_last(phk) @ v
    y = phq @ s
    ym = merge_heads(y)
    out = linear_prefixed(p, "to_out.0", ym)
    cache = {"x": x, "p": p, "n_head": n_head, "xm": xm, "phq": phq, "phk": phk, "v": v, "s": s,
             "ym": ym, "cq": cq, "ck": ck, "out_shape": out.shape}
    return out, cache


def linear_no_attention_backward(dout, cache):
    """Gradients of :func:`linear_no_attention_forward` (derivation in its docstring)."""
    x, p = cache["x"], cache["p"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dy = split_heads(linear_prefixed_vjp(grads, p, "to_out.0", dout, cache["ym"]), cache["n_head"])
    phq, phk, v, s, xm = cache["phq"], cache["phk"], cache["v"], cache["s"], cache["xm"]
    dphq = dy @ swap_last(s)
    ds = swap_last(phq) @ dy
    dphk = v @ swap_last(ds)
    dv = phk @ ds
    if cache["cq"] is not None:
        dlq, grads["temperature_q"] = tempered_softmax_backward(dphq, cache["cq"])
        dlk, grads["temperature_k"] = tempered_softmax_backward(dphk, cache["ck"])
    else:
        dlq, dlk = softmax_vjp(phq, dphq, -1), softmax_vjp(phk, dphk, -2)
    dxm = 0.0
    for name, dl in (("to_q", dlq), ("to_k", dlk), ("to_v", dv)):
        grads[f"{name}.weight"] = np.einsum("bhni,bhno->io", xm, dl)
        dxm = dxm + dl @ p[f"{name}.weight"].T
    grads["x"] = linear_prefixed_vjp(grads, p, "in_project_x", merge_heads(dxm), x)
    return grads


def linear_no_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`linear_no_attention_forward`."""
    return linear_no_attention_forward(x, params, **config)[0]


def linear_no_init_params(rng, dim: int, n_head: int = 8, dim_head: int = 64, key_ratio: int = 4,
                          use_temperature: bool = False, dtype=np.float64) -> dict:
    """PyTorch default linears (upstream applies no special init); temperatures 0.5."""
    p = init_linear_prefixed(rng, dim, n_head * dim_head, "in_project_x")
    p.update(init_linear_prefixed(rng, dim_head, key_ratio, "to_q", bias=False))
    p.update(init_linear_prefixed(rng, dim_head, key_ratio, "to_k", bias=False))
    p.update(init_linear_prefixed(rng, dim_head, dim_head, "to_v", bias=False))
    p.update(init_linear_prefixed(rng, n_head * dim_head, dim, "to_out.0"))
    if use_temperature:
        p["temperature_q"] = np.full(n_head, 0.5)
        p["temperature_k"] = np.full(n_head, 0.5)
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_linear_no(use_temperature):
    def sample(rng, size):
        n, c, h, d, m = slice_sizes(rng, size)
        params = perturb_params(rng, linear_no_init_params(rng, c, h, d, m, use_temperature))
        if use_temperature:
            params["temperature_q"] = rng.uniform(0.3, 0.9, h)
            params["temperature_k"] = rng.uniform(0.3, 0.9, h)
        return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params,
                      config={"n_head": h, "use_temperature": use_temperature})
    return sample


def _linear_no_reference(x, params, *, n_head, use_temperature=False, tau_clamp=(0.01, 1.0)):
    # Explicit O(N^2) form Y = (Phi_q Phi_k^T) V.
    _, c = linear_no_attention_forward(x, params, n_head=n_head, use_temperature=use_temperature,
                                       tau_clamp=tau_clamp)
    y = (c["phq"] @ swap_last(c["phk"])) @ c["v"]
    return merge_heads(y) @ c["p"]["to_out.0.weight"] + c["p"]["to_out.0.bias"]


def _check_linear_no_temperature(rng):
    # The temperature variant checked by FD too (the default record has none).
    from ..testing.gradcheck import gradcheck
    return gradcheck(linear_no_attention_forward, linear_no_attention_backward,
                     _sample_linear_no(True)(rng, "tiny")).max_rel


def _check_linear_no_vs_transolver(rng):
    # LinearNO's core with q-logits = Transolver slice logits / tau and k-logits = log w reproduces
    # Transolver without slice attention (eps = 0) when V = f (to_v = I, x_mid = f).
    n, c, h, d, g = 9, 4, 2, 2, 3
    tp = perturb_params(rng, transolver_init_params(rng, c, h, d, g))
    x = rng.standard_normal((2, n, c))
    out_t, ct = transolver_physics_attention_forward(x, tp, n_head=h, slice_attention="identity",
                                                     slice_eps=0.0)
    fm = ct["front"]["fm"]
    lq = ct["front"]["sm"]["logits"] / ct["front"]["sm"]["tb"]
    lk = np.log(ct["w"])
    phq, _ = softmax_lse(lq, -1)
    phk, _ = softmax_lse(lk, -2)
    y = phq @ (swap_last(phk) @ fm)
    ref = merge_heads(y) @ tp["to_out.0.weight"] + tp["to_out.0.bias"]
    err = float(np.abs(out_t - ref).max())
    assert err < 1e-12, f"LinearNO form does not reproduce Transolver: {err}"
    return err


register(
    Mechanism(
        slug="linear_no_attention", family="3-operator", tier="T1",
        title="LinearNO: Physics-Attention recast as canonical linear attention",
        paper="Hu, Liu, Qiao, Sun, Dou, Transolver is a Linear Transformer, AAAI 2026, arXiv 2511.06294",
        forward=linear_no_attention_forward, backward=linear_no_attention_backward,
        sample=_sample_linear_no(False), reference=_linear_no_reference,
        docs="operator-attention.md#linearno",
        checks={"permutation_equivariance": check_point_permutation(linear_no_attention_forward,
                                                                    _sample_linear_no(False)),
                "temperature_variant_gradcheck": _check_linear_no_temperature,
                "reproduces_transolver_without_slice_attention": _check_linear_no_vs_transolver,
                "uniform_refinement_invariance": check_uniform_refinement(linear_no_attention_forward,
                                                                          _sample_linear_no(False))},
    ),
)
