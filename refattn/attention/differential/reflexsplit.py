r"""ReflexSplit's cross-stream differential window attention: $A_T - \lambda A_R$ and $A_R - \lambda A_T$.

Two streams (transmission $T$ and reflection $R$) that subtract each other's attention map
(mutual, antisymmetric differential attention), with a Swin relative-position bias and
cross-stream enhancement:

$$O_T = (A_T - \lambda A_R)V_T,\qquad O_R = (A_R - \lambda A_T)V_R,\qquad
  \lambda = \mathrm{clip}(\sigma(\lambda_{raw}), 0.01, 0.99).$$

Backward: $dA_T = dD_T - \lambda\,dD_R$, $dA_R = dD_R - \lambda\,dD_T$,
$d\lambda = -\langle dD_T, A_R\rangle - \langle dD_R, A_T\rangle$, softmax VJPs, the bias table by
scatter-add and the cross paths (derivation in `reflexsplit_dual_stream_attention_forward`).

ReflexSplit: dual-stream single-image reflection separation (seed 4-3); code wuw2135/ReflexSplit
``models/arch/reflexsplit.py``@268c213 (``DifferentialDualStreamAttention``).

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, check_param_keys, compute_dtype
from ...nn.activations import sigmoid
from ...nn.softmax import softmax_lse
from ...registry import Mechanism, Sample, register
from ._samples import explicit_softmax
from .core import matrix_param, resolve_scale, softmax_map_backward, vector_param

__all__ = [
    "swin_relative_position_index",
    "reflexsplit_dual_stream_attention_forward",
    "reflexsplit_dual_stream_attention_backward",
    "reflexsplit_dual_stream_attention",
]


_PAPER_REFLEX = "ReflexSplit: dual-stream single-image reflection separation (seed 4-3); code wuw2135/ReflexSplit"


def _scalar(params, name, dt):
    x = as_float(params[name], name)
    if x.size != 1 or x.ndim > 1:
        raise ValueError(f"{name} must be a scalar (shape () or (1,)); got shape {x.shape}")
    return x.astype(dt, copy=False)


def swin_relative_position_index(window_size) -> np.ndarray:
    r"""Swin's relative-position index ``(N, N)`` into a ``((2w_h-1)(2w_w-1), H)`` bias table,
    $N = w_hw_w$: $\mathrm{idx}_{ij} = (\Delta h + w_h - 1)(2w_w - 1) + \Delta w + w_w - 1$."""
    wh, ww = window_size
    coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)
    rel = coords[:, :, None] - coords[:, None, :]
    return (rel[0] + wh - 1) * (2 * ww - 1) + rel[1] + ww - 1


def _rs_keys(branch):
    if branch == "sa":
        proj = ("sa_qkv.weight", "sa_qkv.bias")
    else:
        proj = ("ca_q.weight", "ca_q.bias", "ca_kv.weight", "ca_kv.bias")
    return proj + (f"{branch}_cross_trans_proj.weight", f"{branch}_cross_refl_proj.weight",
                   f"{branch}_enhance_weight", f"lambda_{branch}", "relative_position_bias_table",
                   f"proj_{branch}.weight", f"proj_{branch}.bias")


def reflexsplit_dual_stream_attention_forward(x, params, *, num_heads, window_size, branch="sa",
                                               scale=None, lambda_clip=(0.01, 0.99), qkv_bias=True):
    r"""ReflexSplit's cross-stream differential window attention (``DifferentialDualStreamAttention``).

    ``x (B, 2, N, C)`` holds the window tokens of the two streams, transmission
    ($X_T$ = ``x[:, 0]``) and reflection ($X_R$ = ``x[:, 1]``), $N = w_hw_w$. The output has the
    same layout. With $\beta$ = ``{branch}_enhance_weight``:

    $$\tilde X_T = X_T + \beta\,X_R W_{rp},\qquad \tilde X_R = X_R + \beta\,X_T W_{tp}$$
    $$[Q_s, K_s, V_s] = \tilde X_s W_{qkv} + b,\quad A_s = \mathrm{softmax}(s\,Q_sK_s^\top + B_{rel}),\quad
    \lambda = \mathrm{clip}(\sigma(\lambda_{raw}), 0.01, 0.99)$$
    $$O_T = (A_T - \lambda A_R)V_T,\qquad O_R = (A_R - \lambda A_T)V_R,\qquad \mathrm{out}_s = O_sW_p + b_p$$

    — each stream subtracts the *other* stream's map (mutual, antisymmetric differential
    attention). $B_{rel}$ is Swin's relative-position bias (``relative_position_bias_table``
    ``((2w_h-1)(2w_w-1), H)``, shared by both streams and both branches upstream).

    ``branch="sa"`` (``forward_sa``): one ``sa_qkv`` projection ``(C, 3C)`` (columns q | k | v,
    head-major). ``branch="ca"`` (``forward_ca``): Q from ``ca_q`` ``(C, C)`` and K/V from
    ``ca_kv`` ``(C, 2C)`` applied to $[\tilde X_T; \tilde X_R]$ and split back into the two halves —
    since the projection is per token, this is the same map with separate Q and KV weights.
    Upstream's block adds the two branches: ``x_out = sa(x) + ca(x)`` per stream.

    Upstream: wuw2135/ReflexSplit ``models/arch/reflexsplit.py``. Conventions there: no
    GroupNorm/RMSNorm and no $(1-\lambda_{init})$ factor (``lambda_init_fn`` is defined but unused
    in these forwards), ``lambda_clip=(0.01, 0.99)`` (``None`` disables the clamp; the gradient of
    $\lambda_{raw}$ is 0 where the clamp is active), $\lambda_{raw}$ and $\beta$ initialised to 0.1,
    ``qkv_bias=True``, ``scale`` $=d^{-1/2}$ with $d = C/H$. Parameter keys are the upstream names;
    ``*.weight`` are ``(in, out)`` (``linear.weight.T``).

    Backward
    --------
    With $dO_s$ from $dO_s = d\mathrm{out}_sW_p^\top$ (and $dW_p = \sum_s O_s^\top d\mathrm{out}_s$):
    $dV_s = D_s^\top dO_s$ for $D_T = A_T - \lambda A_R$ (and $D_R$); $dD_s = dO_sV_s^\top$;
    $dA_T = dD_T - \lambda\,dD_R$, $dA_R = dD_R - \lambda\,dD_T$;
    $d\lambda = -\langle dD_T, A_R\rangle - \langle dD_R, A_T\rangle$, then
    $d\lambda_{raw} = d\lambda\,\sigma(1-\sigma)$ inside the clamp (0 outside). Softmax VJPs give
    $dS_s$, $dQ_s = s\,dS_sK_s$, $dK_s = s\,dS_s^\top Q_s$; the bias table gathers
    $\sum_{b,s} dS_s$ by scatter-add over the index. Cross paths: $dX_T = d\tilde X_T + \beta\,d\tilde X_R W_{tp}^\top$,
    $dX_R = d\tilde X_R + \beta\,d\tilde X_T W_{rp}^\top$, $dW_{rp} = \beta X_R^\top d\tilde X_T$,
    $dW_{tp} = \beta X_T^\top d\tilde X_R$, $d\beta = \langle d\tilde X_T, X_RW_{rp}\rangle + \langle d\tilde X_R, X_TW_{tp}\rangle$.
    """
    check_choice(branch, "branch", ("sa", "ca"))
    x = as_float(x, "x", ndim=4)
    if x.shape[1] != 2:
        raise ValueError(f"x must have shape (B, 2, N, C) with the two streams on axis 1; got {x.shape}")
    nh = check_int(num_heads, "num_heads", minimum=1)
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        raise TypeError(f"window_size must be a pair (w_h, w_w); got {window_size!r}")
    wh, ww = (check_int(w, "window_size", minimum=1) for w in window_size)
    b_, _, n, c = x.shape
    if n != wh * ww:
        raise ValueError(f"x has N={n} tokens per window but window_size {tuple(window_size)} has {wh * ww}")
    if c % nh:
        raise ValueError(f"the channel count C={c} must be divisible by num_heads={nh}")
    if not isinstance(qkv_bias, (bool, np.bool_)):
        raise TypeError(f"qkv_bias must be a bool; got {type(qkv_bias).__name__}")
    keys = _rs_keys(branch)
    bias_keys = {k for k in keys if k.endswith(".bias") and k.startswith(("sa_qkv", "ca_q", "ca_kv"))}
    need = tuple(k for k in keys if qkv_bias or k not in bias_keys)
    check_param_keys(params, need)
    dt = compute_dtype(x, *[np.asarray(params[k]) for k in need if np.asarray(params[k]).dtype.kind == "f"])
    x = x.astype(dt, copy=False)
    P = {}
    if branch == "sa":
        P["w_qkv"] = matrix_param(params, "sa_qkv.weight", c, dt, n_out=3 * c)
        P["b_qkv"] = vector_param(params, "sa_qkv.bias", 3 * c, dt) if qkv_bias else None
    else:
        wq = matrix_param(params, "ca_q.weight", c, dt, n_out=c)
        wkv = matrix_param(params, "ca_kv.weight", c, dt, n_out=2 * c)
        P["w_qkv"] = np.concatenate([wq, wkv], axis=1)
        P["b_qkv"] = (np.concatenate([vector_param(params, "ca_q.bias", c, dt), vector_param(params, "ca_kv.bias", 2 * c, dt)])
                      if qkv_bias else None)
    w_tp = matrix_param(params, f"{branch}_cross_trans_proj.weight", c, dt, n_out=c)
    w_rp = matrix_param(params, f"{branch}_cross_refl_proj.weight", c, dt, n_out=c)
    beta = _scalar(params, f"{branch}_enhance_weight", dt)
    lam_raw = _scalar(params, f"lambda_{branch}", dt)
    nt = (2 * wh - 1) * (2 * ww - 1)
    table = as_float(params["relative_position_bias_table"], "relative_position_bias_table", ndim=2)
    if table.shape != (nt, nh):
        raise ValueError(f"relative_position_bias_table must have shape ((2w_h-1)(2w_w-1), H) = ({nt}, {nh}); "
                         f"got {table.shape}")
    table = table.astype(dt, copy=False)
    wp = matrix_param(params, f"proj_{branch}.weight", c, dt, n_out=c)
    bp = vector_param(params, f"proj_{branch}.bias", c, dt)
    hd = c // nh
    sc = resolve_scale(scale, hd)
    if lambda_clip is not None:
        lo, hi = (float(t) for t in lambda_clip)
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"lambda_clip must be (lo, hi) with 0 <= lo < hi <= 1; got {lambda_clip!r}")

    xt, xr = x[:, 0], x[:, 1]
    e_r = xr @ w_rp
    e_t = xt @ w_tp
    xe = np.stack([xt + beta * e_r, xr + beta * e_t], axis=1)  # (B, 2, N, C)
    qkv = xe @ P["w_qkv"]
    if P["b_qkv"] is not None:
        qkv = qkv + P["b_qkv"]
    qkv = qkv.reshape(b_, 2, n, 3, nh, hd).transpose(3, 0, 1, 4, 2, 5)  # (3, B, 2, H, N, hd)
    q, k, v = qkv[0], qkv[1], qkv[2]
    idx = swin_relative_position_index((wh, ww))
    brel = table[idx.reshape(-1)].reshape(n, n, nh).transpose(2, 0, 1)  # (H, N, N)
    s = sc * (q @ np.swapaxes(k, -1, -2)) + brel
    a, _ = softmax_lse(s, -1)  # (B, 2, H, N, N)
    sig = sigmoid(lam_raw)
    if lambda_clip is None:
        lam, dlam_draw = sig, sig * (1 - sig)
    else:
        lam = np.clip(sig, lo, hi)
        sv = float(sig.reshape(-1)[0])
        dlam_draw = sig * (1 - sig) * float(lo < sv < hi)
    d = a - lam * a[:, ::-1]
    o = d @ v  # (B, 2, H, N, hd)
    om = o.transpose(0, 1, 3, 2, 4).reshape(b_, 2, n, c)
    out = om @ wp + bp
    cache = {"x": x, "xe": xe, "e_r": e_r, "e_t": e_t, "w_tp": w_tp, "w_rp": w_rp, "beta": beta,
             "w_qkv": P["w_qkv"], "has_bias": P["b_qkv"] is not None, "q": q, "k": k, "v": v, "a": a, "d": d,
             "lam": lam, "dlam_draw": dlam_draw, "om": om, "wp": wp, "idx": idx, "nt": nt, "scale": sc,
             "branch": branch, "lam_shape": np.shape(params[f"lambda_{branch}"]),
             "beta_shape": np.shape(params[f"{branch}_enhance_weight"])}
    return out, cache


def reflexsplit_dual_stream_attention_backward(dout, cache):
    """Gradients of :func:`reflexsplit_dual_stream_attention_forward` (derivation in its docstring)."""
    x, br = cache["x"], cache["branch"]
    g = as_dout(dout, x.shape, x.dtype)
    b_, _, n, c = x.shape
    q, k, v, a, d, lam = cache["q"], cache["k"], cache["v"], cache["a"], cache["d"], cache["lam"]
    nh, hd = q.shape[2], q.shape[-1]
    om = cache["om"]
    dwp = om.reshape(-1, c).T @ g.reshape(-1, c)
    dbp = g.sum(axis=(0, 1, 2))
    do = (g @ cache["wp"].T).reshape(b_, 2, n, nh, hd).transpose(0, 1, 3, 2, 4)
    dv = np.swapaxes(d, -1, -2) @ do
    dd = do @ np.swapaxes(v, -1, -2)
    da = dd - lam * dd[:, ::-1]
    dlam = -np.sum(dd * a[:, ::-1])
    dq, dk, ds = softmax_map_backward(da, a, q, k, cache["scale"])
    dbrel = ds.sum(axis=(0, 1))  # (H, N, N)
    dtable = np.zeros((cache["nt"], nh), dtype=x.dtype)
    np.add.at(dtable, cache["idx"].reshape(-1), dbrel.transpose(1, 2, 0).reshape(n * n, nh))
    dqkv = np.stack([dq, dk, dv]).transpose(1, 2, 4, 0, 3, 5).reshape(b_, 2, n, 3 * c)
    xe = cache["xe"]
    dw_qkv = xe.reshape(-1, c).T @ dqkv.reshape(-1, 3 * c)
    dxe = dqkv @ cache["w_qkv"].T
    beta = cache["beta"]
    dxe_t, dxe_r = dxe[:, 0], dxe[:, 1]
    dx = np.stack([dxe_t + beta * (dxe_r @ cache["w_tp"].T), dxe_r + beta * (dxe_t @ cache["w_rp"].T)], axis=1)
    dw_rp = beta * (x[:, 1].reshape(-1, c).T @ dxe_t.reshape(-1, c))
    dw_tp = beta * (x[:, 0].reshape(-1, c).T @ dxe_r.reshape(-1, c))
    dbeta = np.sum(dxe_t * cache["e_r"]) + np.sum(dxe_r * cache["e_t"])
    grads = {"x": dx, f"{br}_cross_trans_proj.weight": dw_tp, f"{br}_cross_refl_proj.weight": dw_rp,
             f"{br}_enhance_weight": np.reshape(dbeta, cache["beta_shape"]).astype(x.dtype),
             f"lambda_{br}": np.reshape(dlam * cache["dlam_draw"], cache["lam_shape"]).astype(x.dtype),
             "relative_position_bias_table": dtable, f"proj_{br}.weight": dwp, f"proj_{br}.bias": dbp}
    db_qkv = dqkv.sum(axis=(0, 1, 2))
    if br == "sa":
        grads["sa_qkv.weight"] = dw_qkv
        if cache["has_bias"]:
            grads["sa_qkv.bias"] = db_qkv
    else:
        grads["ca_q.weight"], grads["ca_kv.weight"] = dw_qkv[:, :c], dw_qkv[:, c:]
        if cache["has_bias"]:
            grads["ca_q.bias"], grads["ca_kv.bias"] = db_qkv[:c], db_qkv[c:]
    return grads


def reflexsplit_dual_stream_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`reflexsplit_dual_stream_attention_forward`."""
    return reflexsplit_dual_stream_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reflex_params(rng, c, nh, wh, ww, branch="sa"):
    nt = (2 * wh - 1) * (2 * ww - 1)
    w = lambda i, o: rng.standard_normal((i, o)) / np.sqrt(i)  # noqa: E731
    p = {f"{branch}_cross_trans_proj.weight": w(c, c), f"{branch}_cross_refl_proj.weight": w(c, c),
         f"{branch}_enhance_weight": np.asarray(0.1 + 0.3 * rng.random()),
         f"lambda_{branch}": np.asarray(0.1 + 0.5 * rng.standard_normal()),
         "relative_position_bias_table": 0.3 * rng.standard_normal((nt, nh)),
         f"proj_{branch}.weight": w(c, c), f"proj_{branch}.bias": 0.1 * rng.standard_normal(c)}
    if branch == "sa":
        p["sa_qkv.weight"], p["sa_qkv.bias"] = w(c, 3 * c), 0.1 * rng.standard_normal(3 * c)
    else:
        p["ca_q.weight"], p["ca_q.bias"] = w(c, c), 0.1 * rng.standard_normal(c)
        p["ca_kv.weight"], p["ca_kv.bias"] = w(c, 2 * c), 0.1 * rng.standard_normal(2 * c)
    return p


def _sample_reflex(rng, size, branch="sa"):
    if size == "tiny":
        wh, ww, c, nh = 1, int(rng.integers(2, 4)), 4, 2
    else:
        wh, ww, c, nh = 2, int(rng.integers(2, 4)), 8, 2
    x = rng.standard_normal((2, 2, wh * ww, c))
    return Sample(inputs={"x": x}, params=_reflex_params(rng, c, nh, wh, ww, branch),
                  config={"num_heads": nh, "window_size": (wh, ww), "branch": branch})


def _reference_reflex(x, params, *, num_heads, window_size, branch="sa", scale=None, lambda_clip=(0.01, 0.99),
                      qkv_bias=True):
    # Transcribes the two upstream forwards stream by stream with per-head loops.
    b_, _, n, c = x.shape
    hd = c // num_heads
    sc = hd ** -0.5 if scale is None else scale
    br = branch
    beta = float(params[f"{br}_enhance_weight"])
    xt = x[:, 0] + beta * x[:, 1] @ params[f"{br}_cross_refl_proj.weight"]
    xr = x[:, 1] + beta * x[:, 0] @ params[f"{br}_cross_trans_proj.weight"]
    if br == "sa":
        proj = lambda y: y @ params["sa_qkv.weight"] + params["sa_qkv.bias"]  # noqa: E731
    else:
        proj = lambda y: np.concatenate([y @ params["ca_q.weight"] + params["ca_q.bias"],  # noqa: E731
                                         y @ params["ca_kv.weight"] + params["ca_kv.bias"]], -1)
    idx = swin_relative_position_index(window_size)
    lam = 1 / (1 + np.exp(-float(params[f"lambda_{br}"])))
    if lambda_clip is not None:
        lam = min(max(lam, lambda_clip[0]), lambda_clip[1])
    maps, vals = {}, {}
    for name, xs in (("t", xt), ("r", xr)):
        qkv = proj(xs)
        for hh in range(num_heads):
            qh = qkv[..., hh * hd:(hh + 1) * hd]
            kh = qkv[..., c + hh * hd:c + (hh + 1) * hd]
            vh = qkv[..., 2 * c + hh * hd:2 * c + (hh + 1) * hd]
            bias = params["relative_position_bias_table"][idx, hh]
            maps[name, hh] = explicit_softmax(sc * np.einsum("bnd,bmd->bnm", qh, kh) + bias)
            vals[name, hh] = vh
    outs = []
    for me, other in (("t", "r"), ("r", "t")):
        o = np.concatenate([(maps[me, hh] - lam * maps[other, hh]) @ vals[me, hh] for hh in range(num_heads)], -1)
        outs.append(o @ params[f"proj_{br}.weight"] + params[f"proj_{br}.bias"])
    return np.stack(outs, axis=1)


def _check_reflex_ca_gradcheck(rng):
    from ...testing.gradcheck import gradcheck

    s = _sample_reflex(rng, "tiny", "ca")
    return gradcheck(reflexsplit_dual_stream_attention_forward, reflexsplit_dual_stream_attention_backward,
                     s).max_rel


def _check_reflex_ca_reference(rng):
    s = _sample_reflex(rng, "small", "ca")
    out = reflexsplit_dual_stream_attention(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(out - _reference_reflex(**s.inputs, params=s.params, **s.config)).max())
    assert err < 1e-12, f"ca branch differs from the transcribed upstream forward: {err}"
    return err


def _check_reflex_swap_symmetry(rng):
    # Swapping the streams and the two cross projections swaps the outputs.
    s = _sample_reflex(rng, "small")
    out = reflexsplit_dual_stream_attention(**s.inputs, params=s.params, **s.config)
    p2 = dict(s.params)
    p2["sa_cross_trans_proj.weight"], p2["sa_cross_refl_proj.weight"] = (s.params["sa_cross_refl_proj.weight"],
                                                                         s.params["sa_cross_trans_proj.weight"])
    out2 = reflexsplit_dual_stream_attention(s.inputs["x"][:, ::-1], params=p2, **s.config)
    err = float(np.abs(out2 - out[:, ::-1]).max())
    assert err < 1e-12, f"stream swap does not swap outputs: {err}"
    return err


def _check_reflex_lambda_zero_and_rows(rng):
    s = _sample_reflex(rng, "small")
    _, cache = reflexsplit_dual_stream_attention_forward(**s.inputs, params=s.params, **s.config)
    err_rows = float(np.abs(cache["d"].sum(-1) - (1 - cache["lam"])).max())
    assert err_rows < 1e-12, f"rows of A_s - lambda A_s' do not sum to 1 - lambda: {err_rows}"
    # lambda -> 0 (clamp off): two independent window attentions (changing stream R leaves out_T).
    p0 = dict(s.params, lambda_sa=np.asarray(-80.0), sa_enhance_weight=np.asarray(0.0))
    x = s.inputs["x"]
    x2 = x.copy()
    x2[:, 1] += rng.standard_normal(x2[:, 1].shape)
    o1 = reflexsplit_dual_stream_attention(x, params=p0, lambda_clip=None, **s.config)
    o2 = reflexsplit_dual_stream_attention(x2, params=p0, lambda_clip=None, **s.config)
    err = float(np.abs(o1[:, 0] - o2[:, 0]).max())
    assert err < 1e-12, f"lambda = 0, beta = 0 still couples the streams: {err}"
    # With the clamp active (sigmoid(-80) < 0.01) lambda_raw receives no gradient.
    out, cache = reflexsplit_dual_stream_attention_forward(x, params=p0, **s.config)
    gr = reflexsplit_dual_stream_attention_backward(np.ones_like(out), cache)
    assert gr["lambda_sa"] == 0 and abs(cache["lam"] - 0.01) < 1e-15, "clamp does not stop the gradient"
    return max(err, err_rows)


register(
    Mechanism(
        slug="reflexsplit_dual_stream_attention", family="2-differential", tier="T1",
        title="ReflexSplit cross-stream differential window attention (A_T - lambda A_R, A_R - lambda A_T)",
        paper=_PAPER_REFLEX, forward=reflexsplit_dual_stream_attention_forward,
        backward=reflexsplit_dual_stream_attention_backward, sample=_sample_reflex, reference=_reference_reflex,
        docs="differential-relatives.md#reflexsplit-dual-stream-attention",
        checks={"ca_branch_gradcheck": _check_reflex_ca_gradcheck, "ca_branch_reference": _check_reflex_ca_reference,
                "stream_swap_symmetry": _check_reflex_swap_symmetry,
                "lambda_zero_row_sums_clamp": _check_reflex_lambda_zero_and_rows},
    ),
)
