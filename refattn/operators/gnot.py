r"""GNOT heterogeneous normalized (linear) attention (HNA).

Paper: Hao, Wang, Su, Ying, Dong, Liu, Cheng, Song, Zhu, "GNOT: A General Neural Operator
Transformer for Operator Learning", ICML 2023, arXiv 2302.14376. Upstream: HaoZhongkai/GNOT @ 5ee2e69
``models/cgpt.py`` and ``models/mmgpt.py`` (``LinearAttention``, ``LinearCrossAttention``); the
thu-ml/GNOT repository named in the abstract carries the same code. GNOT's geometric-gating
mixture of experts is in ``refattn.operators.gnot_moe``.

Heterogeneous normalized attention (HNA)
----------------------------------------
Per head, with feature maps applied to each row (token) over its $d$ features,
$\tilde q_t = \phi(q_t)$, $\tilde k_j = \phi(k_j)$ (``feature_map="softmax"``: softmax over the
features — upstream's hard-wired ``attn_type='l1'``; ``"l1_norm"``: $q/\lVert q\rVert_1$,
upstream's ``'l2'`` branch):

$$z_t = \tilde q_t\,[+]\;\sum_{l=1}^{L}\frac{\tilde q_t^\top\big(\tilde K_l^\top V_l\big)}{D_{l,t}},\qquad
D_{l,t} = \tilde q_t\cdot\sum_j\tilde k_{l,j}\ (\texttt{"row"})\ \text{or}\ N_l\ (\texttt{"1/N"}),$$

for $L$ input functions (cross-attention, ``LinearCrossAttention``; each with its own key and
value projections) or $L = 1$ with $K, V$ from ``y`` (default ``x``: self-attention,
``LinearAttention``). With the softmax feature map and the row normaliser the weights
$w_{tj} = \tilde q_t\cdot\tilde k_j/\sum_{j'}\tilde q_t\cdot\tilde k_{j'}$ are positive and sum to
1 (a convex combination of the values). The leading $\tilde q_t$ is the upstream ``+ q``
residual, absent from the paper's displayed formula (``query_residual``). Output projection
``proj``. For ``"l1_norm"`` upstream normalises with $\sum_c|\tilde q_{tc}(\sum_j\tilde k_j)_c|$.

Backward (per branch $l$, $G = \partial L/\partial z$, $S = \tilde K^\top V$, $D^{-1}$ as above):
$d\tilde q \mathrel{+}= (G D^{-1})S^\top + \delta_t\,\partial D_t/\partial\tilde q_t$ with
$\delta_t = -D_t^{-2}\,\langle G_t, \tilde q_t^\top S\rangle$;
$dS = \tilde q^\top(GD^{-1})$; $d\tilde K = V\,dS^\top + \mathbf 1\,(\sum_t\delta_t\,\partial D_t/\partial\bar k)$;
$dV = \tilde K\,dS$; the residual adds $G$ to $d\tilde q$; then the feature-map VJP per row
(softmax: $\phi\odot(g - \langle g,\phi\rangle)$; L1: $g/s - \mathrm{sign}(q)\langle g, q\rangle/s^2$,
$s = \lVert q\rVert_1$) and the linear VJPs.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from .common import swap_last

__all__ = [
    "gnot_hna_attention_forward",
    "gnot_hna_attention_backward",
    "gnot_hna_attention",
    "gnot_hna_init_params",
]


def _fmap(t, kind):
    if kind == "softmax":
        return softmax_lse(t, -1)[0]
    return t / np.sum(np.abs(t), axis=-1, keepdims=True)


def _fmap_vjp(g, t, phi, kind):
    if kind == "softmax":
        return softmax_vjp(phi, g, -1)
    s = np.sum(np.abs(t), axis=-1, keepdims=True)
    return g / s - np.sign(t) * np.sum(g * t, axis=-1, keepdims=True) / s ** 2


def _as_inputs(y):
    if isinstance(y, (list, tuple)):
        if len(y) == 0:
            raise ValueError("y must be an array (B, M, C) or a non-empty list of such arrays")
        return [as_float(t, f"y[{i}]", ndim=3) for i, t in enumerate(y)], True
    return [as_float(y, "y", ndim=3)], False


def gnot_hna_attention_forward(x, params, y=None, *, n_head: int, feature_map="softmax",
                               normaliser="row", query_residual: bool = True):
    r"""GNOT heterogeneous normalized linear attention (self or cross; see the module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        Query points' features.
    params : dict
        Self-attention (``LinearAttention``): ``query.*``, ``key.*``, ``value.*``, ``proj.*``
        (weight (C, C), bias (C,)). Cross-attention (``LinearCrossAttention``): ``query.*``,
        ``keys.{l}.*``, ``values.{l}.*`` for $l = 0..L-1$, ``proj.*``.
    y : array (B, M, C) or list of L such arrays (lengths may differ), optional
        Input functions. Self-attention params use ``y`` (default ``x``) for keys and values;
        cross-attention params require a list (or one array when L = 1).
    n_head : int
    feature_map : {"softmax", "l1_norm"}
        Row feature map (upstream ``'l1'``, hard-wired in ``__init__``; or the ``'l2'`` branch).
    normaliser : {"row", "1/N"}
        $D_t = \tilde q_t\cdot\sum_j\tilde k_j$ (upstream) or the number of key points
        (upstream's ``'galerkin'`` branch; thuml/Neural-Solver-Library's "Galerkin" block).
    query_residual : bool
        Add $\tilde q$ (upstream code: True; the paper's formula: False).

    Returns
    -------
    out (B, N, C), cache
    """
    check_choice(feature_map, "feature_map", ("softmax", "l1_norm"))
    check_choice(normaliser, "normaliser", ("row", "1/N"))
    if not isinstance(query_residual, (bool, np.bool_)):
        raise TypeError(f"query_residual must be a bool; got {type(query_residual).__name__}")
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    n_head = check_int(n_head, "n_head", minimum=1)
    if c % n_head:
        raise ValueError(f"the channel count of x ({c}) must be divisible by n_head ({n_head})")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    cross = "keys.0.weight" in params
    if cross:
        if y is None:
            raise ValueError("cross-attention params (keys.0.*) need the input functions y")
        ys, is_list = _as_inputs(y)
        n_in = len(ys)
        kv = [(f"keys.{i}", f"values.{i}") for i in range(n_in)]
    else:
        ys, is_list = ([x], False) if y is None else _as_inputs(y)
        if len(ys) != 1:
            raise ValueError(f"self-attention params take one input function; got {len(ys)} (use keys.{{l}}.* params)")
        kv = [("key", "value")]
    for i, t in enumerate(ys):
        if t.shape[0] != b or t.shape[2] != c:
            raise ValueError(f"y[{i}] must have shape (B={b}, M, C={c}); got {t.shape}")
    spec = {}
    for name in ["query", *[a for pair in kv for a in pair], "proj"]:
        spec[f"{name}.weight"] = (c, c)
        spec[f"{name}.bias"] = (c,)
    p = check_params(params, spec)
    dt = compute_dtype(x, *ys, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    ys = [t.astype(dt, copy=False) for t in ys]
    yin = None if (y is None and not cross) else ys

    q = split_heads(linear_prefixed(p, "query", x), n_head)
    phq = _fmap(q, feature_map)
    z = phq if query_residual else np.zeros_like(phq)
    branches = []
    for (kn, vn), t in zip(kv, ys):
        k = split_heads(linear_prefixed(p, kn, t), n_head)
        v = split_heads(linear_prefixed(p, vn, t), n_head)
        phk = _fmap(k, feature_map)
        ksum = phk.sum(axis=2, keepdims=True)                 # (B, H, 1, d)
        if normaliser == "1/N":
            den = np.full(phq.shape[:-1] + (1,), float(t.shape[1]), dtype=dt)
        elif feature_map == "softmax":
            den = np.sum(phq * ksum, axis=-1, keepdims=True)
        else:
            den = np.sum(np.abs(phq * ksum), axis=-1, keepdims=True)
        s = swap_last(phk) @ v
        num = phq @ s
        z = z + num / den
        branches.append({"kn": kn, "vn": vn, "y": t, "k": k, "phk": phk, "v": v, "ksum": ksum,
                         "den": den, "s": s, "num": num})
    zm = merge_heads(z)
    out = linear_prefixed(p, "proj", zm)
    cache = {"x": x, "p": p, "n_head": n_head, "q": q, "phq": phq, "br": branches, "zm": zm,
             "fmap": feature_map, "norm": normaliser, "res": query_residual, "cross": cross,
             "yin": yin, "is_list": is_list, "out_shape": out.shape}
    return out, cache


def gnot_hna_attention_backward(dout, cache):
    """Gradients of :func:`gnot_hna_attention_forward`: ``x``, ``y`` (when given; a list when a
    list was given) and every params key."""
    x, p, phq, fm = cache["x"], cache["p"], cache["phq"], cache["fmap"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    g = split_heads(linear_prefixed_vjp(grads, p, "proj", dout, cache["zm"]), cache["n_head"])
    dphq = g.copy() if cache["res"] else np.zeros_like(phq)
    dys = []
    for br in cache["br"]:
        den, s, num, ksum, phk = br["den"], br["s"], br["num"], br["ksum"], br["phk"]
        gd = g / den
        dphq = dphq + gd @ swap_last(s)
        ds = swap_last(phq) @ gd
        dphk = br["v"] @ swap_last(ds)
        dv = phk @ ds
        if cache["norm"] == "row":
            delta = -np.sum(g * num, axis=-1, keepdims=True) / den ** 2   # dL/dD_t
            if fm == "softmax":
                dden_dq, dden_dk = ksum, phq
            else:
                sg = np.sign(phq * ksum)
                dden_dq, dden_dk = sg * ksum, sg * phq
            dphq = dphq + delta * dden_dq
            dphk = dphk + np.sum(delta * dden_dk, axis=2, keepdims=True)
        dk = _fmap_vjp(dphk, br["k"], phk, fm)
        dy = linear_prefixed_vjp(grads, p, br["kn"], merge_heads(dk), br["y"])
        dy = dy + linear_prefixed_vjp(grads, p, br["vn"], merge_heads(dv), br["y"])
        dys.append(dy)
    dq = _fmap_vjp(dphq, cache["q"], phq, fm)
    dx = linear_prefixed_vjp(grads, p, "query", merge_heads(dq), x)
    if cache["yin"] is None:
        dx = dx + dys[0]
    else:
        grads["y"] = dys if cache["is_list"] else dys[0]
    grads["x"] = dx
    return grads


def gnot_hna_attention(x, params, y=None, **config):
    """Convenience wrapper: the output of :func:`gnot_hna_attention_forward`."""
    return gnot_hna_attention_forward(x, params, y, **config)[0]


def gnot_hna_init_params(rng, n_embd: int, *, n_inputs: int | None = None, dtype=np.float64) -> dict:
    """PyTorch default linears. ``n_inputs=None``: ``LinearAttention`` keys (query, key, value,
    proj); an integer: ``LinearCrossAttention`` keys (query, keys.{l}, values.{l}, proj)."""
    names = ["query", "key", "value"] if n_inputs is None else \
        ["query", *[f"{a}.{i}" for i in range(n_inputs) for a in ("keys", "values")]]
    p = {}
    for name in [*names, "proj"]:
        p.update(init_linear_prefixed(rng, n_embd, n_embd, name))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_hna(cross, feature_map="softmax", normaliser="row"):
    def sample(rng, size):
        n, c, h = (int(rng.integers(3, 5)), 4, 2) if size == "tiny" else (int(rng.integers(7, 12)), 6, 2)
        x = rng.standard_normal((2, n, c))
        if cross:
            params = gnot_hna_init_params(rng, c, n_inputs=1)
            inputs = {"x": x, "y": rng.standard_normal((2, n + 1, c))}
        else:
            params = gnot_hna_init_params(rng, c)
            inputs = {"x": x}
        params = {k: v * 2.0 for k, v in params.items()}   # O(1) logits: non-trivial softmaxes
        return Sample(inputs=inputs, params=params,
                      config={"n_head": h, "feature_map": feature_map, "normaliser": normaliser})
    return sample


def _hna_reference(x, params, y=None, *, n_head, feature_map="softmax", normaliser="row",
                   query_residual=True):
    # Explicit O(N M) weights w_tj = q_t.k_j / D_t, z_t = q_t + sum_j w_tj v_j.
    _, c = gnot_hna_attention_forward(x, params, y, n_head=n_head, feature_map=feature_map,
                                      normaliser=normaliser, query_residual=query_residual)
    z = c["phq"] if query_residual else 0.0
    for br in c["br"]:
        w = (c["phq"] @ swap_last(br["phk"])) / br["den"]
        z = z + w @ br["v"]
    return linear_prefixed(c["p"], "proj", merge_heads(z))


def _check_hna_convex(rng):
    s = _sample_hna(False)(rng, "small")
    _, c = gnot_hna_attention_forward(**s.inputs, params=s.params, **s.config)
    br = c["br"][0]
    w = (c["phq"] @ swap_last(br["phk"])) / br["den"]
    err = float(np.abs(w.sum(-1) - 1).max())
    assert (w > 0).all() and err < 1e-13, f"HNA weights are not a convex combination: {err}"
    return err


def _check_hna_cross_l1_is_self(rng):
    # L = 1 heterogeneous cross-attention with keys.0/values.0 = key/value equals LinearAttention(x, y).
    s = _sample_hna(False)(rng, "small")
    x, p = s.inputs["x"], s.params
    y = rng.standard_normal((2, x.shape[1] + 3, x.shape[2]))
    pc = {k.replace("key.", "keys.0.").replace("value.", "values.0."): v for k, v in p.items()}
    a = gnot_hna_attention(x, p, y, n_head=2)
    b = gnot_hna_attention(x, pc, [y], n_head=2)
    err = float(np.abs(a - b).max())
    assert err < 1e-13, f"L=1 cross-attention differs from LinearAttention(x, y): {err}"
    return err


def _check_hna_cross_two_inputs_fd(rng):
    # FD gradcheck of the heterogeneous (L = 2, different lengths) cross-attention.
    from ..testing.gradcheck import gradcheck

    def fwd(x, y0, y1, params, **cfg):
        return gnot_hna_attention_forward(x, params, [y0, y1], **cfg)

    def bwd(dout, cache):
        g = gnot_hna_attention_backward(dout, cache)
        y0, y1 = g.pop("y")
        return dict(g, y0=y0, y1=y1)

    params = {k: 2 * v for k, v in gnot_hna_init_params(rng, 4, n_inputs=2).items()}
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 4)), "y0": rng.standard_normal((2, 2, 4)),
                       "y1": rng.standard_normal((2, 4, 4))}, params=params, config={"n_head": 2})
    return gradcheck(fwd, bwd, s).max_rel


def _check_hna_variants_fd(rng):
    from ..testing.gradcheck import gradcheck
    errs = []
    for fm, nm in (("l1_norm", "row"), ("softmax", "1/N")):
        s = _sample_hna(True, fm, nm)(rng, "tiny")
        s.config["query_residual"] = fm == "softmax"
        errs.append(gradcheck(gnot_hna_attention_forward, gnot_hna_attention_backward, s).max_rel)
    return max(errs)


def _check_permutation_hna(rng):
    s = _sample_hna(True)(rng, "small")
    x, y = s.inputs["x"], s.inputs["y"]
    out = gnot_hna_attention(x, s.params, y, **s.config)
    px, py = rng.permutation(x.shape[1]), rng.permutation(y.shape[1])
    out_p = gnot_hna_attention(x[:, px], s.params, y[:, py], **s.config)
    err = float(np.abs(out_p - out[:, px]).max())
    assert err < 1e-12, f"not equivariant in queries / invariant in input points: {err}"
    return err


def _check_hna_refinement(rng):
    # Row-normalised attention is a normalised average over the input points: repeating every
    # input point k times (uniform refinement) leaves the output unchanged.
    s = _sample_hna(True)(rng, "small")
    out = gnot_hna_attention(**s.inputs, params=s.params, **s.config)
    out3 = gnot_hna_attention(s.inputs["x"], s.params, np.repeat(s.inputs["y"], 3, axis=1), **s.config)
    err = float(np.abs(out3 - out).max())
    assert err < 1e-12, f"uniform refinement of the input function changes the output: {err}"
    return err


register(
    Mechanism(
        slug="gnot_hna_attention", family="3-operator", tier="T1",
        title="GNOT heterogeneous normalized (linear) attention",
        paper="Hao et al., GNOT: A General Neural Operator Transformer for Operator Learning, ICML 2023, arXiv 2302.14376",
        forward=gnot_hna_attention_forward, backward=gnot_hna_attention_backward,
        sample=_sample_hna(True), reference=_hna_reference,
        docs="operator-attention.md#gnot-heterogeneous-normalized-attention",
        checks={"weights_convex": _check_hna_convex,
                "cross_L1_equals_linear_attention": _check_hna_cross_l1_is_self,
                "heterogeneous_two_inputs_gradcheck": _check_hna_cross_two_inputs_fd,
                "l1_norm_and_1_over_N_gradcheck": _check_hna_variants_fd,
                "permutation": _check_permutation_hna,
                "uniform_refinement_invariance": _check_hna_refinement},
    ),
)
