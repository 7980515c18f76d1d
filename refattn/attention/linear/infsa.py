r"""Infinite Self-Attention (InfSA) and Linear-InfSA: Frobenius-normalised single-hop diffusion and its
principal-eigenvector (one power step) linear variant.

Roffo, Palmer, "Self-Attention And Beyond the Infinite: Towards Linear Transformers with Infinite
Self-Attention", 2026, arXiv 2603.00175 (v1 "Infinite Self-Attention"). Upstream:
``giorgioroffo/infinite-self-attention`` ``infsa/core.py`` (``pure_infsa_scores``,
``linear_infsa_scores``, ``infsa_attention``) and ``infsa/attention.py`` (``InfSAAttention``) @
``4a37fc02bb2d323462e696e3118df25043d839be``.

The paper treats each layer as a diffusion step on a content-adaptive token graph; stacking
layers accumulates the discounted Neumann series $\sum_k\rho^kA^k = (I - \rho A)^{-1}$ (the
fundamental matrix of an absorbing Markov chain; Katz/PageRank centrality). The code's layer is the
single hop (multi-hop "emerges through stacked layers"), with $\tilde q = q/\sqrt D$,
$\tilde k = k/\sqrt D$ ($D$ the head width) and $\rho = \sigma(\rho_{\text{logit}})$:

* ``variant="pure"`` (upstream ``pure_infsa``), $O(N^2)$:
  $$R = \mathrm{ReLU}(\tilde Q\tilde K^\top),\qquad A = \rho\,\frac{R}{\|R\|_F + \epsilon},\qquad O = AV.$$
  $\|A\|_2\le\|A\|_F<\rho<1$, so the Neumann series of $A$ converges for any input.
* ``variant="linear"`` (``linear_infsa``), $O(N)$: the energy-weighted query summary
  $\bar q = \sum_t w_t\tilde q_t$, $w_t = \|\tilde q_t\|/(\sum_{t'}\|\tilde q_{t'}\| + \epsilon)$, then
  $$a_n = \mathrm{ReLU}(\bar q^\top\tilde k_n),\qquad s = \rho\,\frac{a}{\sum_na_n + \epsilon},\qquad
  o_i = \sum_ns_nv_n\ \text{for every } i,$$
  a state of size $D$. When $\tilde Q\tilde K^\top\ge 0$ entrywise, $a = w^\top\mathrm{ReLU}(\tilde Q\tilde K^\top)$
  exactly: one left power-iteration step of the affinity from the energy weights, approximating
  its principal (eigenvector-centrality) vector.

The layer (``InfSAAttention``): ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (biases optional), heads
split as usual, $\rho$ from ``rho_logit``.

Backward
--------
Pure: $dA = g V^\top$, $dV = A^\top g$; with $f = \|R\|_F$:
$dR = \frac{\rho}{f+\epsilon}dA - \frac{\rho\,\langle dA, R\rangle}{(f+\epsilon)^2}\frac Rf$,
$dS = dR\odot[S > 0]$, $d\tilde Q = dS\tilde K$, $d\tilde K = dS^\top\tilde Q$,
$d\rho = \langle dA, R\rangle/(f+\epsilon)$. Linear: $dp = \sum_ig_i$ (the pooled vector feeds every
position), $dv_n = s_n\,dp$, $ds_n = v_n^\top dp$, $d\rho = \langle ds, \hat a\rangle$; through the
normalisation $da_n = \rho(ds_n/Z - \langle ds, a\rangle/Z^2)$, $Z = \sum a + \epsilon$; the ReLU; then
$d\bar q = \sum_n da'_n\tilde k_n$, $d\tilde k_n = da'_n\bar q$, and through the summary
$d\tilde q_t = w_t\,d\bar q + \big(\tfrac{dw_t}{E} - \tfrac{\langle dw, e\rangle}{E^2}\big)\tilde q_t/e_t$ with
$dw_t = d\bar q^\top\tilde q_t$, $e_t = \|\tilde q_t\|$, $E = \sum e + \epsilon$. Finally
$d\rho_{\text{logit}} = \rho(1-\rho)\,d\rho$ and the linear VJPs.

Conventions
-----------
``rho_grad``: upstream reads $\rho$ with ``torch.sigmoid(self.rho_logit).item()``, which detaches it,
so ``rho_logit`` never receives a gradient although the docstring calls it learnable
(``"detached"``, the upstream default: the backward returns a zero gradient for it); ``"full"``
differentiates it (what the finite-difference check uses). ``eps`` 1e-6 as upstream; score
dropout (training only) is not part of the reference. Linear-InfSA broadcasts the pooled vector to
every position, so it needs as many queries as keys (upstream's ``expand_as(v)``).
**Reconstruction:** none beyond the keyword above — the layer is the code's; the paper's
infinite series is the stack of layers, shown by the Neumann-series check.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_param_keys, check_positive, compute_dtype
from ...nn.activations import sigmoid
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel
from .core import mT

__all__ = [
    "INFSA_VARIANTS",
    "infsa_scores_forward",
    "infsa_scores_backward",
    "infsa_attention_forward",
    "infsa_attention_backward",
    "infsa_attention",
]

INFSA_VARIANTS = ("pure", "linear")
_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def infsa_scores_forward(q, k, v, rho: float, *, variant: str, eps: float = 1e-6):
    r"""InfSA on heads ``q (..., N, D)``, ``k, v (..., S, D)`` (unvalidated; module docstring).
    Returns ``(out, cache)``; ``cache["A"]`` (pure) or ``cache["s"]`` (linear) are the scores."""
    D = q.shape[-1]
    qt, kt = q / math.sqrt(D), k / math.sqrt(D)
    if variant == "pure":
        S = qt @ mT(kt)
        R = np.maximum(S, 0.0)
        f = np.sqrt(np.sum(R * R, axis=(-2, -1), keepdims=True))
        A = rho * R / (f + eps)
        return A @ v, {"variant": variant, "qt": qt, "kt": kt, "v": v, "S": S, "R": R, "f": f, "A": A,
                       "rho": rho, "eps": eps, "D": D}
    e = np.sqrt(np.sum(qt * qt, axis=-1))
    E = np.sum(e, axis=-1, keepdims=True) + eps
    w = e / E
    qbar = np.einsum("...t,...td->...d", w, qt)
    s_ = np.einsum("...d,...nd->...n", qbar, kt)
    a = np.maximum(s_, 0.0)
    Z = np.sum(a, axis=-1, keepdims=True) + eps
    ahat = a / Z
    sc = rho * ahat
    pooled = np.einsum("...n,...nd->...d", sc, v)
    out = np.broadcast_to(pooled[..., None, :], v.shape).copy()
    return out, {"variant": variant, "qt": qt, "kt": kt, "v": v, "e": e, "E": E, "w": w, "qbar": qbar, "sraw": s_,
                 "a": a, "Z": Z, "ahat": ahat, "s": sc, "rho": rho, "D": D}


def infsa_scores_backward(g, c):
    """VJP of :func:`infsa_scores_forward`: ``(dq, dk, dv, drho)``."""
    D, rho = c["D"], c["rho"]
    if c["variant"] == "pure":
        A, R, f, S, v, eps = c["A"], c["R"], c["f"], c["S"], c["v"], c["eps"]
        dA = g @ mT(v)
        dv = mT(A) @ g
        inner = np.sum(dA * R, axis=(-2, -1), keepdims=True)
        dR = rho / (f + eps) * dA - rho * inner / (f + eps) ** 2 * R / np.where(f == 0, 1.0, f)
        dS = dR * (S > 0)
        drho = np.sum(inner / (f + eps))
        return dS @ c["kt"] / math.sqrt(D), mT(dS) @ c["qt"] / math.sqrt(D), dv, drho
    qt, kt, v = c["qt"], c["kt"], c["v"]
    dp = np.sum(g, axis=-2)
    dv = c["s"][..., :, None] * dp[..., None, :]
    ds = np.einsum("...nd,...d->...n", v, dp)
    drho = np.sum(ds * c["ahat"])
    dah = rho * ds
    Z, a = c["Z"], c["a"]
    da = dah / Z - np.sum(dah * a, axis=-1, keepdims=True) / Z ** 2
    dsr = da * (c["sraw"] > 0)
    dqbar = np.einsum("...n,...nd->...d", dsr, kt)
    dkt = dsr[..., :, None] * c["qbar"][..., None, :]
    dw = np.einsum("...d,...td->...t", dqbar, qt)
    e, E = c["e"], c["E"]
    de = dw / E - np.sum(dw * e, axis=-1, keepdims=True) / E ** 2
    dqt = c["w"][..., :, None] * dqbar[..., None, :] + (de / np.where(e == 0, 1.0, e))[..., None] * qt
    return dqt / math.sqrt(D), dkt / math.sqrt(D), dv, drho


def _validate(query, key, value, params, num_heads, variant, rho_grad, eps):
    check_choice(variant, "variant", INFSA_VARIANTS)
    check_choice(rho_grad, "rho_grad", ("detached", "full"))
    eps = check_positive(eps, "eps", allow_zero=True)
    query = as_float(query, "query", min_ndim=2)
    key = query if key is None else as_float(key, "key", min_ndim=2)
    value = key if value is None else as_float(value, "value", min_ndim=2)
    E = query.shape[-1]
    if isinstance(num_heads, (bool, np.bool_)) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1 \
            or E % num_heads:
        raise ValueError(f"num_heads must be a positive int dividing the embedding width {E}; got {num_heads!r}")
    if key.shape[:-2] != query.shape[:-2] or value.shape[:-1] != key.shape[:-1]:
        raise ValueError(f"key/value must share query's leading axes and each other's length; got query "
                         f"{query.shape}, key {key.shape}, value {value.shape}")
    if variant == "linear" and key.shape[-2] != query.shape[-2]:
        raise ValueError(f"variant='linear' broadcasts the pooled value to every key position: key must have "
                         f"query's length {query.shape[-2]}; got {key.shape[-2]}")
    spec = {"q_proj.weight": (E, E), "k_proj.weight": (key.shape[-1], E), "v_proj.weight": (value.shape[-1], E),
            "out_proj.weight": (E, E)}
    spec["rho_logit"] = (1,)
    biases = {f"{p}.bias": (E,) for p in _PROJ}  # optional: upstream InfSAAttention(bias=False)
    check_param_keys(params, tuple(spec), tuple(biases), where="infsa_attention", shapes={**spec, **biases})
    spec.update({k: s for k, s in biases.items() if params.get(k) is not None})
    P = {}
    for kk, shape in spec.items():
        arr = as_float(params[kk], kk)
        if arr.shape != shape:
            raise ValueError(f"{kk} must have shape {shape}; got {arr.shape}")
        P[kk] = arr
    dt = compute_dtype(query, key, value, *P.values())
    return (query.astype(dt, copy=False), key.astype(dt, copy=False), value.astype(dt, copy=False),
            {kk: vv.astype(dt, copy=False) for kk, vv in P.items()}, eps)


def infsa_attention_forward(query, key=None, value=None, params=None, *, num_heads: int = 1, variant: str = "pure",
                            rho_grad: str = "detached", eps: float = 1e-6):
    r"""Multi-head InfSA / Linear-InfSA (Roffo, Palmer, arXiv 2603.00175), upstream ``InfSAAttention``.

    Parameters
    ----------
    query : (..., N, E); key, value : (..., S, E), optional (default: self-attention)
    params : dict
        ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` ``.weight`` ``(E, E)`` (stored ``(in, out)``)
        and ``.bias`` ``(E,)`` (optional: upstream ``bias=False``); ``rho_logit`` ``(1,)``
        ($\rho = \sigma(\rho_{\text{logit}})$).
    num_heads : int
    variant : {"pure", "linear"}
    rho_grad : {"detached", "full"}
        Upstream detaches $\rho$ (``.item()``); ``"full"`` differentiates it.
    eps : float
        Upstream's 1e-6 in the Frobenius/energy/attention normalisers.
    """
    q_in, k_in, v_in, P, eps = _validate(query, key, value, params, num_heads, variant, rho_grad, eps)
    H = num_heads
    q = split_heads(linear_prefixed(P, "q_proj", q_in), H)
    k = split_heads(linear_prefixed(P, "k_proj", k_in), H)
    v = split_heads(linear_prefixed(P, "v_proj", v_in), H)
    rho = float(sigmoid(P["rho_logit"].astype(np.float64))[0])
    att, sc = infsa_scores_forward(q, k, v, rho, variant=variant, eps=eps)
    merged = merge_heads(att)
    out = linear_prefixed(P, "out_proj", merged)
    cache = {"q_in": q_in, "k_in": k_in, "v_in": v_in, "P": P, "H": H, "sc": sc, "merged": merged, "out": out,
             "rho": rho, "rho_grad": rho_grad, "self": key is None and value is None, "kv_same": value is None}
    return out.copy(), cache


def infsa_attention_backward(dout, cache):
    r"""Gradients ``{"query"[, "key", "value"]}`` and every parameter of :func:`infsa_attention_forward`."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    P, H = cache["P"], cache["H"]
    grads = {}
    dmerged = linear_prefixed_vjp(grads, P, "out_proj", g, cache["merged"])
    dq, dk, dv, drho = infsa_scores_backward(split_heads(dmerged, H), cache["sc"])
    dqi = linear_prefixed_vjp(grads, P, "q_proj", merge_heads(dq), cache["q_in"])
    dki = linear_prefixed_vjp(grads, P, "k_proj", merge_heads(dk), cache["k_in"])
    dvi = linear_prefixed_vjp(grads, P, "v_proj", merge_heads(dv), cache["v_in"])
    rho = cache["rho"]
    full = cache["rho_grad"] == "full"
    grads["rho_logit"] = np.array([rho * (1.0 - rho) * drho if full else 0.0], dtype=out.dtype)
    if cache["self"]:
        grads["query"] = dqi + dki + dvi
    elif cache["kv_same"]:
        grads["query"], grads["key"] = dqi, dki + dvi
    else:
        grads["query"], grads["key"], grads["value"] = dqi, dki, dvi
    return grads


def infsa_attention(query, key=None, value=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`infsa_attention_forward`."""
    return infsa_attention_forward(query, key, value, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(query, key=None, value=None, params=None, *, num_heads=1, variant="pure", rho_grad="detached",
               eps=1e-6):
    """Explicit form: the N x S score matrix (pure: rho ReLU(QK^T/D)/(|.|_F + eps); linear: every row the
    normalised ReLU(qbar K^T)), times V, per head."""
    key = query if key is None else key
    value = key if value is None else value
    H = num_heads
    q = split_heads(query @ params["q_proj.weight"] + params["q_proj.bias"], H)
    k = split_heads(key @ params["k_proj.weight"] + params["k_proj.bias"], H)
    v = split_heads(value @ params["v_proj.weight"] + params["v_proj.bias"], H)
    rho = 1.0 / (1.0 + np.exp(-params["rho_logit"][0]))
    D = q.shape[-1]
    if variant == "pure":
        R = np.maximum(q @ mT(k) / D, 0.0)
        A = rho * R / (np.linalg.norm(R, axis=(-2, -1), keepdims=True) + eps)
    else:
        e = np.linalg.norm(q / math.sqrt(D), axis=-1)
        qbar = np.einsum("...t,...td->...d", e / (e.sum(-1, keepdims=True) + eps), q / math.sqrt(D))
        a = np.maximum(np.einsum("...d,...nd->...n", qbar, k / math.sqrt(D)), 0.0)
        A = np.broadcast_to((rho * a / (a.sum(-1, keepdims=True) + eps))[..., None, :], q.shape[:-1] + (k.shape[-2],))
    return merge_heads(A @ v) @ params["out_proj.weight"] + params["out_proj.bias"]


def _infsa_params(rng, E, rho_logit=1.5):
    params = {}
    for p in _PROJ:
        params[f"{p}.weight"] = rng.standard_normal((E, E)) / np.sqrt(E)
        params[f"{p}.bias"] = 0.1 * rng.standard_normal(E)
    params["rho_logit"] = np.array([rho_logit + 0.3 * rng.standard_normal()])
    return params


def _sample(rng, size):
    E, H = (4, 2) if size == "tiny" else (6, 3)
    n = int(rng.integers(3, 6)) if size == "tiny" else int(rng.integers(8, 14))
    x = rng.standard_normal((2, n, E))
    return Sample(inputs={"query": x}, params=_infsa_params(rng, E),
                  config={"num_heads": H, "variant": INFSA_VARIANTS[int(rng.integers(0, 2))], "rho_grad": "full"})


def _check_neumann_series(rng):
    """||A||_F < rho < 1, so the discounted multi-hop series converges: sum_{k<K} A^k approaches
    (I - A)^{-1} (the absorbing-chain fundamental matrix) with error below rho^K / (1 - rho)."""
    q, k = rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 4))
    _, c = infsa_scores_forward(q, k, k, 0.9, variant="pure")
    A = c["A"]
    assert np.all(np.linalg.norm(A, axis=(-2, -1)) < 0.9)
    inv = np.linalg.inv(np.eye(9) - A)
    S, P = np.zeros_like(A), np.broadcast_to(np.eye(9), A.shape).copy()
    for _ in range(40):
        S, P = S + P, P @ A
    err = float(np.max(np.linalg.norm(S - inv, ord=2, axis=(-2, -1))))
    assert err < 0.9 ** 40 / 0.1, err
    return err


def _check_linear_is_power_step(rng):
    """Linear-InfSA is one left power-iteration step: with Q K^T >= 0 the scores equal
    rho * normalise(w^T ReLU(Q K^T / D)) exactly, w the energy weights; and for an affinity with a
    dominant direction their cosine with the principal left eigenvector exceeds 0.98 (the paper
    reports 0.985 on trained ViTs)."""
    q = np.abs(rng.standard_normal((3, 12, 4)))
    k = np.abs(rng.standard_normal((3, 12, 4)))
    _, c = infsa_scores_forward(q, k, k, 0.8, variant="linear", eps=0.0)
    R = np.maximum(q @ mT(k) / 4, 0)
    e = np.linalg.norm(q / 2, axis=-1)
    step = np.einsum("bt,btn->bn", e / e.sum(-1, keepdims=True), R)
    err = float(np.max(np.abs(c["s"] - 0.8 * step / step.sum(-1, keepdims=True))))
    assert err < 1e-12, err
    cos = []
    for b in range(3):
        w, vl = np.linalg.eig(R[b].T)
        pv = np.abs(np.real(vl[:, np.argmax(np.real(w))]))
        cos.append(float(pv @ c["s"][b] / np.linalg.norm(pv) / np.linalg.norm(c["s"][b])))
    assert min(cos) > 0.98, cos
    return err


def _check_fd_cross_and_detached(rng):
    """Cross-attention (separate key and value) for both variants by finite differences, and
    rho_grad='detached' returns a zero rho_logit gradient with every other gradient unchanged."""
    errs = []
    for variant in INFSA_VARIANTS:
        qx, kx, vx = (rng.standard_normal((1, 3, 4)) for _ in range(3))
        s = Sample(inputs={"query": qx, "key": kx, "value": vx}, params=_infsa_params(rng, 4),
                   config={"num_heads": 2, "variant": variant, "rho_grad": "full"})
        errs.append(fd_max_rel(infsa_attention_forward, infsa_attention_backward, s))
        _, c1 = infsa_attention_forward(qx, kx, vx, s.params, num_heads=2, variant=variant, rho_grad="full")
        _, c2 = infsa_attention_forward(qx, kx, vx, s.params, num_heads=2, variant=variant)
        g = rng.standard_normal(c1["out"].shape)
        g1, g2 = infsa_attention_backward(g, c1), infsa_attention_backward(g, c2)
        assert g2["rho_logit"][0] == 0.0 and g1["rho_logit"][0] != 0.0
        assert all(np.array_equal(g1[kk], g2[kk]) for kk in g1 if kk != "rho_logit")
    return max(errs)


register(
    Mechanism(
        slug="linear_infsa_neumann", family="4-linear-kernel-sparse", tier="T3",
        title="Infinite Self-Attention (Frobenius-normalised diffusion hop) and Linear-InfSA (one power step)",
        paper="Roffo, Palmer, 'Self-Attention And Beyond the Infinite: Towards Linear Transformers with Infinite "
              "Self-Attention', 2026, arXiv 2603.00175",
        official_code="giorgioroffo/infinite-self-attention (infsa/core.py, infsa/attention.py)",
        forward=infsa_attention_forward, backward=infsa_attention_backward, sample=_sample, reference=_reference,
        checks={"neumann_series_converges": _check_neumann_series,
                "linear_is_one_power_step": _check_linear_is_power_step,
                "gradcheck_cross_attention_and_detached_rho": _check_fd_cross_and_detached},
        docs="linear/kernel-features.md#infsa-and-linear-infsa",
    ),
)
