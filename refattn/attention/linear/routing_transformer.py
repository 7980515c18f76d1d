r"""Routing Transformer: online k-means routing and attention within each cluster.

Roy, Saffar, Vaswani, Grangier, "Efficient Content-Based Sparse Attention with Routing
Transformers", TACL 2021, arXiv 2003.05997. Official code: google-research/google-research
``routing_transformer/utils.py@0c1bbe5fc971a1de1a427debc814e66ab4f1e7fa``
(``clustered_local_attention_helper``, ``cluster_items``, ``online_kmeans``, ``nearest_neighbor``,
``gather_cluster_attention_items``, ``scatter_cluster_items``, ``clustered_attention_bias_nd``,
``layer_norm``).

Forward (per batch element and head)
------------------------------------
Queries and keys are layer-normalised without an affine map (``layer_norm(x, scaling=False)``,
$\epsilon = 10^{-6}$): $\hat q_i = \mathrm{LN}(q_i)$, $\hat k_j = \mathrm{LN}(k_j)$ (with
``share_qk``, $\hat k = \hat q$). With the head's centroids $\mu_1..\mu_C$ (upstream ``means``,
``(H, C, d)``), routing is *balanced*: cluster $c$ takes the ``attention_window`` $w$ queries of largest
$\hat q_i\cdot\mu_c$ and, separately, the $w$ keys of largest $\hat k_j\cdot\mu_c$
(``tf.math.top_k(-dist)`` with $\mathrm{dist} = -x\cdot\mu$), each list sorted by position. Within
cluster $c$, with $Q_c, K_c, V_c$ the gathered rows,

$$O_c = \mathrm{softmax}(s\,\hat Q_c\hat K_c^\top + \text{mask})\,V_c,\qquad
o_i = \frac{\sum_{c:\ i\in Q_c}(O_c)_{\mathrm{slot}_c(i)}}{n_i + \varepsilon_s}$$

($n_i$ the number of clusters that picked query $i$, $\varepsilon_s = 10^{-2}$: upstream's
``scatter_cluster_items`` divides by ``count + 1e-2``; a query no cluster picked outputs 0). The
scores use the normalised vectors with no further scale ($s = 1$: the $d^{-1/2}$ applied to $q$
before is undone by the layer norm). ``causal`` masks with a lower triangle over the *slots* of the
two sorted lists (``clustered_attention_bias_nd``, ``causal_rule="slot"``, upstream), which is
position causality when the query and key lists coincide (``share_qk``);
``causal_rule="position"`` masks $j > i$ by position (the paper's $j < i$ rule, plus the diagonal).

Fast form and explicit form. The gathered computation costs $O(Cw^2d)$; it equals the dense form
$o_i = \frac{1}{n_i + \varepsilon_s}\sum_{c:\,i\in Q_c}\sum_{j\in K_c}\mathrm{softmax}_{j\in K_c}(\cdot)\,v_j$
with cluster keep-masks (the record's reference, loops with a brute-force sort per cluster).

Backward (routing held fixed)
-----------------------------
The assignments are top-$w$ selections of $\hat x\cdot\mu_c$: piecewise constant. The centroids
receive no gradient from the attention (upstream trains them by EMA, or by a separate codebook
loss when ``ema=False``); they are a configuration buffer here. Through the selected computation:
$g_i/(n_i + \varepsilon_s)$ is gathered into every cluster slot of $i$, the per-cluster softmax
attention VJP gives $d\hat Q_c, d\hat K_c, dV_c$, the scatter-add adjoint of the gathers sums them
into $d\hat q, d\hat k, dv$ (a token picked by several clusters accumulates), and the layer-norm
VJP (`refattn.nn.norms`) gives $dq, dk$ (with ``share_qk``, $d\hat q$ collects both and $dk = 0$).

The centroid update (training only, no gradient)
------------------------------------------------
`routing_kmeans_ema_update` is upstream's ``online_kmeans`` with ``ema=True``: nearest centroid
$a_i = \arg\max_c \hat x_i\cdot\mu_c$ (``nearest_neighbor``), counts $n_c$ and sums
$s_c = \sum_{a_i = c}\hat x_i$ over the batch, $N_c\leftarrow\lambda N_c + (1-\lambda)n_c$,
$S_c\leftarrow\lambda S_c + (1-\lambda)s_c$, Laplace smoothing
$\tilde N_c = (N_c + \epsilon)/(\sum N + C\epsilon)\cdot\sum N$ and $\mu_c = S_c/\tilde N_c$, with the
commitment loss $\mathrm{mean}\,\|\hat x - \mu_{a}\|^2$. (The paper writes the update as
$\mu\leftarrow\lambda\mu + \frac{1-\lambda}{2}(\sum\hat q + \sum\hat k)$; upstream applies the EMA
to the queries' and the keys' assignments in turn.) The forward and backward of the attention use the
centroids as given.

Not implemented: upstream's implicit padding rule (all-zero value rows get $-10^9$), the
``strided_attention`` variant, relative attention, the token bias and the mixed local heads
of ``multihead_attention_nd`` (other mechanisms).

Agreement with upstream: the TF1 code (TensorFlow not installed) transcribed to PyTorch
(``layer_norm``, ``nearest_neighbor``, ``gather_cluster_attention_items``,
``clustered_attention_bias_nd``, ``dot_product_attention``, ``scatter_cluster_items``): output
6.7e-16, gradients <= 7.1e-16 relative.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, check_positive, compute_dtype
from ...nn.norms import normalize_backward, normalize_forward
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward
from ._samples import draw_until, fd_max_rel, topk_margin
from .core import gather_rows, mT, scatter_add_rows, validate_linear_qkv

__all__ = ["CAUSAL_RULES", "routing_assignments", "routing_attention_forward", "routing_attention_backward",
           "routing_attention", "routing_kmeans_ema_update"]

CAUSAL_RULES = ("slot", "position")


def routing_assignments(x_hat: np.ndarray, centroids: np.ndarray, window: int) -> np.ndarray:
    r"""Balanced routing: for ``x_hat (..., H, N, d)`` and ``centroids (H, C, d)``, the positions
    ``(..., H, C, w)`` of the ``window`` items of largest $\hat x\cdot\mu_c$ of every cluster, sorted
    ascending (upstream ``gather_cluster_attention_items``). Unvalidated."""
    scores = mT(x_hat @ mT(centroids))  # (..., H, C, N)
    idx = np.argpartition(-scores, window - 1, axis=-1)[..., :window] if window < scores.shape[-1] else \
        np.broadcast_to(np.arange(scores.shape[-1]), scores.shape).copy()
    return np.sort(idx, axis=-1)


def _gather(x, idx):
    c, w = idx.shape[-2:]
    flat = idx.reshape(idx.shape[:-2] + (c * w,))
    return gather_rows(x, flat).reshape(idx.shape + (x.shape[-1],))


def _scatter(g, idx, n):
    c, w = idx.shape[-2:]
    return scatter_add_rows(g.reshape(g.shape[:-3] + (c * w, g.shape[-1])), idx.reshape(idx.shape[:-2] + (c * w,)), n)


def routing_attention_forward(q, k, v, *, centroids, attention_window: int, causal: bool = False,
                              causal_rule: str = "slot", share_qk: bool = False, scale: float = 1.0,
                              eps: float = 1e-6, scatter_eps: float = 1e-2):
    r"""Routing attention (the clustered heads of the Routing Transformer).

    Parameters
    ----------
    q : (..., H, N, d); k : (..., H, M, d); v : (..., H, M, d_v)
        Equal leading axes. ``causal`` needs ``M == N``; ``share_qk`` routes and attends with
        $\hat k = \hat q$ (``k`` is then unused and gets a zero gradient).
    centroids : (H, C, d)
        The cluster means (a buffer: no gradient).
    attention_window : int
        Items per cluster $w$ (``sparsity_cluster_attention_window``), at most ``N`` and ``M``.
    causal, causal_rule
        Causal mask over the sorted slots (``"slot"``, upstream) or by position (``"position"``).
    scale : float > 0
        Score scale on the normalised vectors (upstream: 1).
    eps : float > 0
        Layer-norm epsilon (upstream ``layer_norm``: 1e-6).
    scatter_eps : float >= 0
        Added to the per-token cluster count in the output average (upstream 1e-2).

    Returns
    -------
    out : (..., H, N, d_v), cache
        ``cache["idx_q"]``, ``cache["idx_k"]``: the routing ``(..., H, C, w)``.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if not isinstance(share_qk, (bool, np.bool_)):
        raise TypeError(f"share_qk must be a bool; got {type(share_qk).__name__}")
    check_choice(causal_rule, "causal_rule", CAUSAL_RULES)
    scale = check_positive(scale, "scale")
    eps = check_positive(eps, "eps")
    scatter_eps = check_positive(scatter_eps, "scatter_eps", allow_zero=True)
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal or share_qk))
    mu = as_float(centroids, "centroids", ndim=3)
    h, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    if mu.shape[0] != h or mu.shape[2] != q.shape[-1]:
        raise ValueError(f"centroids must have shape (H={h}, C, d={q.shape[-1]}); got {mu.shape}")
    w = check_int(attention_window, "attention_window", minimum=1)
    if w > min(n, m):
        raise ValueError(f"attention_window must be <= the sequence lengths (N={n}, M={m}); got {w}")
    dt = compute_dtype(q, k, v)
    mu = mu.astype(dt, copy=False)
    qh, qs = normalize_forward(q, (q.ndim - 1,), eps)
    kh, ks = (qh, qs) if share_qk else normalize_forward(k, (k.ndim - 1,), eps)
    idx_q = routing_assignments(qh, mu, w)
    idx_k = idx_q if share_qk else routing_assignments(kh, mu, w)
    keep = None
    if causal:
        keep = np.tri(w, dtype=bool) if causal_rule == "slot" else idx_q[..., :, None] >= idx_k[..., None, :]
    oc, core = attention_core_forward(_gather(qh, idx_q), _gather(kh, idx_k), _gather(v, idx_k), attn_mask=keep,
                                      scale=scale)
    cnt = _scatter(np.ones(idx_q.shape + (1,), dt), idx_q, n)[..., 0]
    den = (cnt + scatter_eps)[..., None]
    out = _scatter(oc, idx_q, n) / np.where(den == 0, 1.0, den)
    cache = {"core": core, "idx_q": idx_q, "idx_k": idx_k, "den": den, "qh": qh, "kh": kh, "qs": qs, "ks": ks,
             "share_qk": bool(share_qk), "n": n, "m": m, "out_shape": out.shape}
    return out, cache


def routing_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of `routing_attention_forward`, the routing held fixed and the
    centroids constant (module docstring)."""
    core = cache["core"]
    g = as_dout(dout, cache["out_shape"], core["p"].dtype)
    den = cache["den"]
    gc = _gather(g / np.where(den == 0, 1.0, den), cache["idx_q"])
    gr = attention_core_backward(gc, core)
    dqh = _scatter(gr["q"], cache["idx_q"], cache["n"])
    dkh = _scatter(gr["k"], cache["idx_k"], cache["m"])
    dv = _scatter(gr["v"], cache["idx_k"], cache["m"])
    if cache["share_qk"]:
        dq = normalize_backward(dqh + dkh, cache["qh"], cache["qs"])
        return {"q": dq, "k": np.zeros_like(dq), "v": dv}
    return {"q": normalize_backward(dqh, cache["qh"], cache["qs"]),
            "k": normalize_backward(dkh, cache["kh"], cache["ks"]), "v": dv}


def routing_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of `routing_attention_forward`."""
    return routing_attention_forward(q, k, v, **config)[0]


def routing_kmeans_ema_update(x_hat, centroids, ema_count, ema_means, *, decay: float = 0.99,
                              epsilon: float = 1e-5) -> dict:
    r"""One online k-means EMA step (upstream ``online_kmeans`` with ``ema=True``; no gradient).

    ``x_hat (..., H, N, d)`` the normalised items, ``centroids (H, C, d)``, ``ema_count (H, C)``,
    ``ema_means (H, C, d)``. Returns ``{"centroids", "ema_count", "ema_means", "commitment_loss"}``
    (the new state; the inputs are not modified). ``decay`` defaults to ``multihead_attention_nd``'s
    0.99. Items that are all zero (upstream's padding) do not count.
    """
    x = as_float(x_hat, "x_hat", min_ndim=3)
    mu = as_float(centroids, "centroids", ndim=3)
    cnt = as_float(ema_count, "ema_count", ndim=2)
    means = as_float(ema_means, "ema_means", ndim=3)
    h, c, d = mu.shape
    if x.shape[-3] != h or x.shape[-1] != d or cnt.shape != (h, c) or means.shape != (h, c, d):
        raise ValueError(f"x_hat (..., H, N, d), centroids (H, C, d), ema_count (H, C) and ema_means (H, C, d) "
                         f"must agree; got {x.shape}, {mu.shape}, {cnt.shape}, {means.shape}")
    decay = check_positive(decay, "decay")
    epsilon = check_positive(epsilon, "epsilon")
    onehot = np.eye(c, dtype=x.dtype)[np.argmax(x @ mT(mu), axis=-1)]  # (..., H, N, C)
    onehot = onehot * (np.sum(np.abs(x), axis=-1, keepdims=True) != 0)
    lead = tuple(range(onehot.ndim - 3))
    count = np.sum(onehot, axis=lead + (onehot.ndim - 2,))                     # (H, C)
    dw = np.einsum("bhnc,bhnd->hcd", onehot.reshape((-1,) + onehot.shape[-3:]), x.reshape((-1,) + x.shape[-3:]))
    new_cnt = decay * cnt + (1.0 - decay) * count
    new_means = decay * means + (1.0 - decay) * dw
    total = np.sum(new_cnt, axis=-1, keepdims=True)
    smoothed = (new_cnt + epsilon) / (total + c * epsilon) * total
    x_means = np.einsum("...hnc,hcd->...hnd", onehot, mu)
    return {"centroids": new_means / smoothed[..., None], "ema_count": new_cnt, "ema_means": new_means,
            "commitment_loss": float(np.mean((x - x_means) ** 2))}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _ln(x, eps=1e-6):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)


def _reference(q, k, v, *, centroids, attention_window, causal=False, causal_rule="slot", share_qk=False,
               scale=1.0, eps=1e-6, scatter_eps=1e-2):
    """Dense loops: a brute-force sort per cluster, then every (cluster, query) row over its keys."""
    qh = _ln(q, eps)
    kh = qh if share_qk else _ln(k, eps)
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(*q.shape[:-3]):
        for h in range(q.shape[-3]):
            acc = np.zeros((q.shape[-2], v.shape[-1]))
            cnt = np.zeros(q.shape[-2])
            for mu in centroids[h]:
                qi = sorted(sorted(range(q.shape[-2]), key=lambda i: -qh[idx + (h, i)] @ mu)[:attention_window])
                kj = sorted(sorted(range(k.shape[-2]), key=lambda j: -kh[idx + (h, j)] @ mu)[:attention_window])
                for a, i in enumerate(qi):
                    js = [j for b, j in enumerate(kj) if not causal or (b <= a if causal_rule == "slot" else j <= i)]
                    cnt[i] += 1
                    if not js:
                        continue
                    sc = np.array([scale * qh[idx + (h, i)] @ kh[idx + (h, j)] for j in js])
                    wgt = np.exp(sc - sc.max())
                    acc[i] += (wgt / wgt.sum()) @ v[idx + (h,)][js]
            den = cnt + scatter_eps
            out[idx + (h,)] = acc / np.where(den == 0, 1.0, den)[:, None]  # an unpicked token outputs 0
    return out


def _draw(rng, size, causal=None, causal_rule=None, share_qk=False):
    b, h = 2, 2
    n = 6 if size == "tiny" else int(rng.integers(9, 13))
    d, dv = (3, 2) if size == "tiny" else (4, 3)
    n_clusters = 2 if size == "tiny" else 3
    w = 3 if size == "tiny" else int(rng.integers(3, 5))
    causal = bool(rng.integers(0, 2)) if causal is None else causal
    causal_rule = CAUSAL_RULES[int(rng.integers(0, 2))] if causal_rule is None else causal_rule
    mu = _ln(rng.standard_normal((h, n_clusters, d))) / np.sqrt(d)

    def draw(r):
        return tuple(r.standard_normal((b, h, n, x)) for x in (d, d, dv))

    def margin(t):
        sc = [mT(_ln(x) @ mT(mu)) for x in (t[0],) + (() if share_qk else (t[1],))]
        return min(topk_margin(s, w) for s in sc)

    q, k, v = draw_until(rng, draw, margin, 0.02)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"centroids": mu, "attention_window": w, "causal": causal, "causal_rule": causal_rule,
                          "share_qk": share_qk})


def _sample(rng, size):
    return _draw(rng, size)


def _check_one_cluster_is_attention(rng):
    """One cluster holding every token: softmax attention on the normalised q, k (causal for both
    rules), scaled by 1/(1 + scatter_eps)."""
    q, k, v = (rng.standard_normal((2, 2, 7, 4)) for _ in range(3))
    mu = rng.standard_normal((2, 1, 4))
    err = 0.0
    for causal, rule in ((False, "slot"), (True, "slot"), (True, "position")):
        a = routing_attention(q, k, v, centroids=mu, attention_window=7, causal=causal, causal_rule=rule)
        b = attention_core_forward(_ln(q), _ln(k), v, is_causal=causal, scale=1.0)[0] / 1.01
        err = max(err, float(np.max(np.abs(a - b))))
    assert err < 1e-12, f"one cluster with w = N differs from attention by {err}"
    return err


def _check_routing_brute_force(rng):
    s = _draw(rng, "small")
    x, c = s.inputs, s.config
    _, cache = routing_attention_forward(x["q"], x["k"], x["v"], **c)
    for name, key in (("q", "idx_q"), ("k", "idx_k")):
        xh = _ln(x[name])
        for idx in np.ndindex(*xh.shape[:-2]):
            for ci, mu in enumerate(c["centroids"][idx[-1]]):
                bf = sorted(sorted(range(xh.shape[-2]), key=lambda i: -xh[idx + (i,)] @ mu)[:c["attention_window"]])
                assert list(cache[key][idx + (ci,)]) == bf, f"routing of {name} differs from the brute-force sort"
    return 0.0


def _check_ema_update(rng):
    """The EMA step against a loop over tokens."""
    x = _ln(rng.standard_normal((2, 2, 9, 3)))
    mu = _ln(rng.standard_normal((2, 4, 3)))
    cnt, means = rng.uniform(0, 3, (2, 4)), rng.standard_normal((2, 4, 3))
    new = routing_kmeans_ema_update(x, mu, cnt, means, decay=0.9)
    c2, s2 = 0.9 * cnt, 0.9 * means
    for b in range(2):
        for h in range(2):
            for i in range(9):
                a = int(np.argmax([x[b, h, i] @ m for m in mu[h]]))
                c2[h, a] += 0.1
                s2[h, a] += 0.1 * x[b, h, i]
    tot = c2.sum(-1, keepdims=True)
    ref = s2 / ((c2 + 1e-5) / (tot + 4e-5) * tot)[..., None]
    err = max(float(np.max(np.abs(new["centroids"] - ref))), float(np.max(np.abs(new["ema_count"] - c2))))
    assert err < 1e-12, f"EMA centroid update differs from the loop by {err}"
    return err


def _check_gradcheck_share_qk_position(rng):
    s = _draw(rng, "tiny", causal=True, causal_rule="position", share_qk=True)
    return fd_max_rel(routing_attention_forward, routing_attention_backward, s)


register(
    Mechanism(
        slug="routing_transformer_kmeans", family="4-linear-kernel-sparse", tier="T2",
        title="Routing Transformer (online k-means sparse attention)",
        paper="Roy, Saffar, Vaswani, Grangier, 'Efficient Content-Based Sparse Attention with Routing "
              "Transformers', TACL 2021, arXiv 2003.05997",
        forward=routing_attention_forward, backward=routing_attention_backward, sample=_sample,
        reference=_reference,
        checks={"one_cluster_equals_attention": _check_one_cluster_is_attention,
                "routing_equals_brute_force_sort": _check_routing_brute_force,
                "kmeans_ema_update_equals_loop": _check_ema_update,
                "gradcheck_share_qk_position_rule": _check_gradcheck_share_qk_position},
        docs="linear/sparse-attention.md#routing-transformer",
    ),
)
