r"""PCT offset-attention: $x + \mathrm{ReLU}(\mathrm{BN}((x - x_r)W_t + b_t))$ with a column-renormalised softmax map.

$x_r = A^\top v$ with $A$ the row softmax $\tilde A$ renormalised over its columns,
$A_{ij} = \tilde A_{ij}/(\epsilon + \sum_{i'}\tilde A_{i'j})$; $x - x_r$ is the "offset" (a
discrete-Laplacian-like difference of a token and its attention-weighted average), a signed
combination that makes it a relative of differential attention.

Backward: ReLU and BatchNorm VJPs (train mode couples the batch), $dz = dt\,W_t^\top$ for
$z = x - x_r$, the column-normalisation VJP, the row-softmax VJP and the projections (derivation
in `pct_offset_attention_forward`).

Paper: M.-H. Guo et al., "PCT: Point Cloud Transformer", Computational Visual Media 2021, arXiv
2012.09688. Upstream: the official PCT is Jittor (MenghaoGuo/PCT); refattn follows the PyTorch
port Strawberry-Eat-Mango/PCT_Pytorch ``model.py``@471ad3a ``SA_Layer``.

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_param_keys, check_positive, compute_dtype
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import explicit_softmax
from .core import matrix_param, vector_param

__all__ = [
    "pct_offset_attention_forward",
    "pct_offset_attention_backward",
    "pct_offset_attention",
]


_PAPER_PCT = "M.-H. Guo et al., 'PCT: Point Cloud Transformer', Computational Visual Media 2021, arXiv 2012.09688"


_PCT_KEYS = ("k_conv.weight", "v_conv.weight", "v_conv.bias", "trans_conv.weight", "trans_conv.bias",
             "after_norm.weight", "after_norm.bias")


def pct_offset_attention_forward(x, params, *, shared_qk=True, scale=1.0, col_eps=1e-9, bn_mode="train",
                                 running_mean=None, running_var=None, bn_eps=1e-5):
    r"""PCT offset-attention layer (Guo et al. 2021), token-major ``x (B, N, C)``.

    $$q = xW_q,\; k = xW_k,\; v = xW_v + b_v,\quad \tilde A = \mathrm{softmax}_j(s\,q k^\top),\quad
    A_{ij} = \frac{\tilde A_{ij}}{\epsilon + \sum_{i'}\tilde A_{i'j}},$$
    $$x_r = A^\top v,\qquad y = x + \mathrm{ReLU}\big(\mathrm{BN}((x - x_r)W_t + b_t)\big).$$

    $x - x_r$ is the "offset" (a discrete-Laplacian-like difference of a token and its
    attention-weighted average): point $j$ receives $\sum_i A_{ij}v_i$ with columns of $A$ summing
    to ~1.

    Upstream: the official PCT is Jittor (MenghaoGuo/PCT); refattn follows the widely used
    PyTorch port Strawberry-Eat-Mango/PCT_Pytorch ``model.py`` ``SA_Layer``: ``q_conv`` and
    ``k_conv`` are bias-free 1x1 convolutions $C\to C/4$ with **tied weights**
    (``shared_qk=True``; then ``params`` has only ``"k_conv.weight"``; ``shared_qk=False`` adds
    ``"q_conv.weight"``), **no** $1/\sqrt d$ (``scale=1.0``), column re-normalisation with
    ``col_eps=1e-9``, BatchNorm1d over channels with statistics over batch and points
    (``bn_mode="train"``, eps 1e-5; ``"eval"`` uses ``running_mean``/``running_var``).
    Weights are ``(in, out)``: a PyTorch ``Conv1d`` weight ``w`` maps as ``w[:, :, 0].T``; input
    ``x_torch (B, C, N)`` is ``x.transpose(0, 2, 1)``.

    ``bn_mode="train"`` couples the batch elements (batch statistics), as upstream in training.

    Backward
    --------
    With $u = \mathrm{BN}(t)$, $t = (x-x_r)W_t + b_t$ and $G = \partial L/\partial y$:
    $dx \mathrel{+}= G$; $du = G\odot[u>0]$; BN (train):
    $dt = \frac{1}{\sqrt{\sigma^2+\epsilon}}(d\hat t - \overline{d\hat t} - \hat t\,\overline{d\hat t\odot\hat t})$
    with $d\hat t = w\odot du$ and means over batch and points; $dw = \sum du\odot\hat t$,
    $db = \sum du$. Then $dz = dt\,W_t^\top$ for $z = x - x_r$: $dx \mathrel{+}= dz$, $dx_r = -dz$.
    $x_r = A^\top v$: $dA = v\,dx_r^\top$, $dv = A\,dx_r$. Column normalisation:
    $d\tilde A_{ij} = (dA_{ij} - \sum_{i'}A_{i'j}dA_{i'j})/(\epsilon + \sum_{i'}\tilde A_{i'j})$; then the
    row-softmax VJP gives $dE$, $dq = s\,dE\,k$, $dk = s\,dE^\top q$, and the projections
    $dW = x^\top d(\cdot)$, $dx \mathrel{+}= dq W_q^\top + dk W_k^\top + dv W_v^\top$ (tied weights
    receive $dW_q + dW_k$).
    """
    x = as_float(x, "x", ndim=3)
    c = x.shape[-1]
    keys = _PCT_KEYS if shared_qk else _PCT_KEYS + ("q_conv.weight",)
    if not isinstance(shared_qk, (bool, np.bool_)):
        raise TypeError(f"shared_qk must be a bool; got {type(shared_qk).__name__}")
    check_param_keys(params, keys)
    dt = compute_dtype(x, *[np.asarray(params[k]) for k in keys if np.asarray(params[k]).dtype.kind == "f"])
    x = x.astype(dt, copy=False)
    wk = matrix_param(params, "k_conv.weight", c, dt)
    wq = wk if shared_qk else matrix_param(params, "q_conv.weight", c, dt, n_out=wk.shape[1])
    wv = matrix_param(params, "v_conv.weight", c, dt, n_out=c)
    bv = vector_param(params, "v_conv.bias", c, dt)
    wt = matrix_param(params, "trans_conv.weight", c, dt, n_out=c)
    bt = vector_param(params, "trans_conv.bias", c, dt)
    gw = vector_param(params, "after_norm.weight", c, dt)
    gb = vector_param(params, "after_norm.bias", c, dt)
    sc = check_positive(scale, "scale")
    col_eps = check_positive(col_eps, "col_eps", allow_zero=True)
    bn_eps = check_positive(bn_eps, "bn_eps")
    check_choice(bn_mode, "bn_mode", ("train", "eval"))
    if bn_mode == "eval":
        if running_mean is None or running_var is None:
            raise ValueError("bn_mode='eval' needs running_mean and running_var of shape (C,)")
        rm = as_float(running_mean, "running_mean", ndim=1)
        rv = as_float(running_var, "running_var", ndim=1)
        if rm.shape != (c,) or rv.shape != (c,):
            raise ValueError(f"running_mean and running_var must have shape ({c},); got {rm.shape}, {rv.shape}")
        if (rv < 0).any():
            raise ValueError("running_var must be >= 0")

    xq, xk = x @ wq, x @ wk
    xv = x @ wv + bv
    at, _ = softmax_lse(sc * (xq @ np.swapaxes(xk, -1, -2)), -1)
    den = col_eps + at.sum(axis=-2, keepdims=True)
    a = at / den
    xr = np.swapaxes(a, -1, -2) @ xv
    z = x - xr
    t = z @ wt + bt
    if bn_mode == "train":
        mu = t.mean(axis=(0, 1))
        var = t.var(axis=(0, 1))
    else:
        mu, var = rm.astype(dt), rv.astype(dt)
    rstd = 1.0 / np.sqrt(var + bn_eps)
    that = (t - mu) * rstd
    u = gw * that + gb
    y = x + np.maximum(u, 0.0)
    cache = {"x": x, "wq": wq, "wk": wk, "wv": wv, "wt": wt, "gw": gw, "xq": xq, "xk": xk, "xv": xv,
             "at": at, "a": a, "den": den, "z": z, "that": that, "rstd": rstd, "u": u, "scale": sc,
             "shared_qk": shared_qk, "bn_mode": bn_mode}
    return y, cache


def pct_offset_attention_backward(dout, cache):
    """Gradients of :func:`pct_offset_attention_forward` (derivation in its docstring)."""
    x = cache["x"]
    g = as_dout(dout, x.shape, x.dtype)
    du = g * (cache["u"] > 0)
    that, rstd = cache["that"], cache["rstd"]
    dgw = np.sum(du * that, axis=(0, 1))
    dgb = np.sum(du, axis=(0, 1))
    dth = du * cache["gw"]
    if cache["bn_mode"] == "train":
        dtt = rstd * (dth - dth.mean(axis=(0, 1)) - that * np.mean(dth * that, axis=(0, 1)))
    else:
        dtt = rstd * dth
    z = cache["z"]
    dwt = z.reshape(-1, z.shape[-1]).T @ dtt.reshape(-1, dtt.shape[-1])
    dbt = dtt.sum(axis=(0, 1))
    dz = dtt @ cache["wt"].T
    dx = g + dz
    dxr = -dz
    a, xv = cache["a"], cache["xv"]
    da = xv @ np.swapaxes(dxr, -1, -2)
    dxv = a @ dxr
    dat = (da - np.sum(a * da, axis=-2, keepdims=True)) / cache["den"]
    de = softmax_vjp(cache["at"], dat, -1) * cache["scale"]
    dxq = de @ cache["xk"]
    dxk = np.swapaxes(de, -1, -2) @ cache["xq"]
    x2 = x.reshape(-1, x.shape[-1])
    dwq = x2.T @ dxq.reshape(-1, dxq.shape[-1])
    dwk = x2.T @ dxk.reshape(-1, dxk.shape[-1])
    dwv = x2.T @ dxv.reshape(-1, dxv.shape[-1])
    dx = dx + dxq @ cache["wq"].T + dxk @ cache["wk"].T + dxv @ cache["wv"].T
    grads = {"x": dx, "v_conv.weight": dwv, "v_conv.bias": dxv.sum(axis=(0, 1)), "trans_conv.weight": dwt,
             "trans_conv.bias": dbt, "after_norm.weight": dgw, "after_norm.bias": dgb}
    if cache["shared_qk"]:
        grads["k_conv.weight"] = dwq + dwk
    else:
        grads["q_conv.weight"], grads["k_conv.weight"] = dwq, dwk
    return grads


def pct_offset_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`pct_offset_attention_forward`."""
    return pct_offset_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _pct_params(rng, c, cq, shared=True):
    p = {"k_conv.weight": rng.standard_normal((c, cq)) / np.sqrt(c),
         "v_conv.weight": rng.standard_normal((c, c)) / np.sqrt(c), "v_conv.bias": 0.1 * rng.standard_normal(c),
         "trans_conv.weight": rng.standard_normal((c, c)) / np.sqrt(c),
         "trans_conv.bias": 0.1 * rng.standard_normal(c),
         "after_norm.weight": 1.0 + 0.2 * rng.standard_normal(c), "after_norm.bias": 0.5 * rng.standard_normal(c)}
    if not shared:
        p["q_conv.weight"] = rng.standard_normal((c, cq)) / np.sqrt(c)
    return p


def _sample_pct(rng, size):
    if size == "tiny":
        b, n, c, cq = 2, int(rng.integers(3, 5)), 4, 2
    else:
        b, n, c, cq = 2, int(rng.integers(6, 10)), 8, 2
    x = rng.standard_normal((b, n, c))
    cfg = {"bn_mode": "eval", "running_mean": 0.1 * rng.standard_normal(c),
           "running_var": 0.5 + rng.random(c)}
    return Sample(inputs={"x": x}, params=_pct_params(rng, c, cq), config=cfg)


def _reference_pct(x, params, *, shared_qk=True, scale=1.0, col_eps=1e-9, bn_mode="train", running_mean=None,
                   running_var=None, bn_eps=1e-5):
    # Channels-first as in the PyTorch port: x (B, C, N), weights (out, in).
    assert bn_mode == "eval"
    xc = np.swapaxes(x, 1, 2)
    wk = params["k_conv.weight"].T
    wq = wk if shared_qk else params["q_conv.weight"].T
    x_q = np.swapaxes(np.einsum("oc,bcn->bon", wq, xc), 1, 2)
    x_k = np.einsum("oc,bcn->bon", wk, xc)
    x_v = np.einsum("oc,bcn->bon", params["v_conv.weight"].T, xc) + params["v_conv.bias"][:, None]
    att = explicit_softmax(scale * np.einsum("bnc,bcm->bnm", x_q, x_k))
    att = att / (col_eps + att.sum(axis=1, keepdims=True))
    x_r = np.einsum("bcn,bnm->bcm", x_v, att)
    t = np.einsum("oc,bcn->bon", params["trans_conv.weight"].T, xc - x_r) + params["trans_conv.bias"][:, None]
    bn = (t - running_mean[:, None]) / np.sqrt(running_var[:, None] + bn_eps)
    bn = params["after_norm.weight"][:, None] * bn + params["after_norm.bias"][:, None]
    return np.swapaxes(xc + np.maximum(bn, 0), 1, 2)


def _check_pct_train_bn_gradcheck(rng):
    from ...testing.gradcheck import gradcheck

    s = _sample_pct(rng, "tiny")
    s = Sample(inputs=s.inputs, params=s.params, config={"bn_mode": "train"})
    return gradcheck(pct_offset_attention_forward, pct_offset_attention_backward, s).max_rel


def _check_pct_columns_and_untied(rng):
    s = _sample_pct(rng, "small")
    _, cache = pct_offset_attention_forward(**s.inputs, params=s.params, **s.config)
    err_col = float(np.abs(cache["a"].sum(axis=-2) - 1).max())
    assert err_col < 1e-8, f"columns of A do not sum to 1: {err_col}"
    p2 = dict(s.params)
    p2["q_conv.weight"] = p2["k_conv.weight"].copy()
    y1 = pct_offset_attention(**s.inputs, params=s.params, **s.config)
    y2, c2 = pct_offset_attention_forward(**s.inputs, params=p2, shared_qk=False, **s.config)
    g = rng.standard_normal(y2.shape)
    gr1 = pct_offset_attention_backward(g, pct_offset_attention_forward(**s.inputs, params=s.params,
                                                                         **s.config)[1])
    gr2 = pct_offset_attention_backward(g, c2)
    err = max(float(np.abs(y1 - y2).max()),
              float(np.abs(gr1["k_conv.weight"] - gr2["k_conv.weight"] - gr2["q_conv.weight"]).max()))
    assert err < 1e-12, f"tied weights != untied with equal weights: {err}"
    return max(err, err_col)


register(
    Mechanism(
        slug="pct_offset_attention", family="2-differential", tier="T1",
        title="PCT offset-attention x + ReLU(BN((x - x_r) W_t + b_t)), column-renormalised map",
        paper=_PAPER_PCT, forward=pct_offset_attention_forward, backward=pct_offset_attention_backward,
        sample=_sample_pct, reference=_reference_pct, docs="differential-relatives.md#pct-offset-attention",
        checks={"train_mode_bn_gradcheck": _check_pct_train_bn_gradcheck,
                "columns_sum_to_one_and_tied_weights": _check_pct_columns_and_untied},
    ),
)
