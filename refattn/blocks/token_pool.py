r"""Token Pooling: downsample a token set by clustering, keeping the cluster centres.

Marin, Chang, Ranjan, Prabhu, Rastegari, Tuzel, "Token Pooling in Vision Transformers for Image
Classification", WACV 2023, arXiv 2110.03860. No official code is public; the catalogue and the
abstract define the operator, and JoakimHaurum/TokenReduction ``models/kmedoids.py``
(``k_medoids_fit``) @ 88fe07ebbc5ffbf3a36814526577f1a8576e048d is the third-party implementation
read for the conventions (see "Agreement" below).

Forward
-------
Softmax attention smooths its output (a low-pass filter), so the tokens after a block are
redundant; Token Pooling replaces the $M$ tokens $f_1..f_M$ (after ``num_prefix_tokens`` class
tokens, which pass through untouched) by $K < M$ tokens $\hat f_1..\hat f_K$ minimising the
(weighted) reconstruction error, an asymmetric Chamfer distance,

$$\mathcal L(\hat F) = \sum_{i=1}^M w_i\,\min_k d(f_i, \hat f_k),\qquad d = \|\cdot\|^2,$$

with significance weights $w_i > 0$ (``scores``; the paper's weighted variants use the attention
each token receives, e.g. column sums of the previous block's attention; $w \equiv 1$ without
``scores``). It is solved approximately by Lloyd-style clustering for at most ``num_iters``
rounds (stopping early when the assignment no longer changes):

1. initialise $K$ centres: the $K$ tokens with the largest $w$ (weighted; as Haurum et al.), or
   farthest-point sampling starting from the token farthest from the mean (unweighted);
2. assign every token to its nearest centre, $a_i = \arg\min_k d(f_i, \hat f_k)$;
3. update each non-empty cluster $C_k$: **K-Means** $\hat f_k = \sum_{i\in C_k} w_if_i / \sum_{i\in C_k} w_i$;
   **K-Medoids** $\hat f_k = f_{j^*}$, $j^* = \arg\min_{j\in C_k}\sum_{i\in C_k} w_i\,d(f_i, f_j)$
   (an empty cluster keeps its centre).

The output is $[\text{prefix tokens};\ \hat f_1; \dots; \hat f_K]$, the centres in initialisation
order.

Backward (selection held fixed)
-------------------------------
Every centre is a weighted mean over a *defining set* $S_k$ (its last cluster for K-Means; the one
medoid, or the initial token, otherwise): $\hat f_k = \sum_{i\in S_k} w_if_i/W_k$,
$W_k = \sum_{i\in S_k} w_i$. With the assignments, medoids and initial choices held fixed (they are
piecewise constant in $f$ and $w$), $\partial\hat f_k/\partial f_i = [i\in S_k]\,w_i/W_k$ and
$\partial\hat f_k/\partial w_i = [i\in S_k]\,(f_i - \hat f_k)/W_k$, so

$$\bar f_i = \sum_k [i\in S_k]\frac{w_i}{W_k}\bar{\hat f}_k,\qquad
\bar w_i = \sum_k [i\in S_k]\frac{\langle f_i - \hat f_k,\ \bar{\hat f}_k\rangle}{W_k}.$$

For K-Medoids $S_k$ is one token: $\bar f$ routes $\bar{\hat f}_k$ to the medoid and $\bar w = 0$.
Prefix tokens get their gradient unchanged. The clustering itself is tested against brute-force
enumeration (assignments, medoids, global optimum on separated data), not differentiated.

Reconstruction choices
----------------------
The paper's text beyond its abstract was not available here, so these are keywords marked
"reconstruction": ``method`` (``"kmedoids"``: the output tokens are input tokens, as Haurum et
al.'s Token Pooling baseline; ``"kmeans"``), ``num_iters`` (5, ``k_medoids_fit``'s default), the
initialisations above (Haurum et al. start the unweighted case from a random token; we start
deterministically from the token farthest from the mean and use max-min farthest points), the
medoid cost summed over the cluster (Haurum et al. sum each candidate's weighted distance over
*all* tokens), ``metric`` (``"sqeuclidean"``, the objective's $d$; ``"euclidean"`` as
``torch.cdist`` in Haurum et al.), ties broken by the first index.

Agreement
---------
No official code. Haurum et al.'s ``k_medoids_fit`` is a different algorithm (medoid cost over all
tokens): run on the same separated-blob data with the same weights and Euclidean metric it selects
a different medoid set on both test samples, so only the differentiable part is compared: with
the selection fixed, PyTorch autograd through the centres written as weighted means agrees with
our backward to $2.7\times10^{-15}$ max abs (relative $8.8\times10^{-15}$, on the K-Means weight
gradient, a difference $f_i - \hat f_k$).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_int, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["token_pooling_forward", "token_pooling_backward", "token_pooling", "token_pooling_clusters",
           "TOKEN_POOLING_METHODS"]

TOKEN_POOLING_METHODS = ("kmedoids", "kmeans")


def _dist(a, b, metric):
    d = np.maximum(np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1), 0.0)
    return np.sqrt(d) if metric == "euclidean" else d


def _cluster_one(f, w, k, method, num_iters, metric, weighted):
    """Defining-set masks ``(K, M)`` and the final assignment ``(M,)`` of one token set."""
    m = f.shape[0]
    if weighted:
        idx = list(np.argsort(-w, kind="stable")[:k])
    else:
        idx = [int(np.argmax(np.sum((f - f.mean(axis=0)) ** 2, axis=1)))]
        mind = _dist(f, f[idx], "sqeuclidean")[:, 0]
        for _ in range(1, k):
            mind[idx] = -1.0
            j = int(np.argmax(mind))
            idx.append(j)
            mind = np.minimum(mind, _dist(f, f[[j]], "sqeuclidean")[:, 0])
    masks = np.zeros((k, m), dtype=bool)
    masks[np.arange(k), idx] = True
    centres = f[idx]
    assign = None
    pair = _dist(f, f, metric) if method == "kmedoids" else None
    for _ in range(num_iters):
        new = np.argmin(_dist(f, centres, "sqeuclidean"), axis=1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        for c in range(k):
            members = np.flatnonzero(assign == c)
            if members.size == 0:
                continue
            if method == "kmeans":
                masks[c] = assign == c
                ww = w[members]
                centres[c] = ww @ f[members] / ww.sum()
            else:
                cost = w[members] @ pair[np.ix_(members, members)]
                j = members[int(np.argmin(cost))]
                masks[c] = False
                masks[c, j] = True
                centres[c] = f[j]
    if assign is None:
        assign = np.argmin(_dist(f, centres, "sqeuclidean"), axis=1)
    return masks, assign


def _config(x, scores, num_clusters, method, num_iters, num_prefix_tokens, metric):
    x = as_float(x, "x", ndim=3)
    p = check_int(num_prefix_tokens, "num_prefix_tokens", minimum=0)
    m = x.shape[1] - p
    if m < 1:
        raise ValueError(f"x has {x.shape[1]} tokens, not more than num_prefix_tokens={p}")
    k = check_int(num_clusters, "num_clusters", minimum=1)
    if k > m:
        raise ValueError(f"num_clusters ({k}) must be at most the number of pooled tokens N - num_prefix_tokens = {m}")
    check_choice(method, "method", TOKEN_POOLING_METHODS)
    check_choice(metric, "metric", ("sqeuclidean", "euclidean"))
    it = check_int(num_iters, "num_iters", minimum=0)
    if scores is not None:
        scores = as_float(scores, "scores", ndim=2)
        if scores.shape != (x.shape[0], m):
            raise ValueError(f"scores must have shape (B, N - num_prefix_tokens) = {(x.shape[0], m)}; got {scores.shape}")
        if np.any(scores <= 0):
            raise ValueError("scores must be > 0 (they weight the tokens' reconstruction errors)")
    dt = compute_dtype(x, scores)
    x = x.astype(dt, copy=False)
    w = np.ones((x.shape[0], m), dt) if scores is None else scores.astype(dt, copy=False)
    return x, w, p, k, it


def token_pooling_clusters(x, scores=None, *, num_clusters: int, method: str = "kmedoids", num_iters: int = 5,
                           num_prefix_tokens: int = 1, metric: str = "sqeuclidean"):
    r"""The clustering alone: ``(masks, assign)`` with ``masks (B, K, M)`` boolean (row $k$ = the set
    $S_k$ defining centre $k$: its cluster for K-Means, its medoid for K-Medoids) and ``assign
    (B, M)`` the final cluster of every pooled token (arguments as `token_pooling_forward`)."""
    x, w, p, k, it = _config(x, scores, num_clusters, method, num_iters, num_prefix_tokens, metric)
    out = [_cluster_one(x[b, p:], w[b], k, method, it, metric, scores is not None) for b in range(x.shape[0])]
    return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])


def token_pooling_forward(x, scores=None, *, num_clusters: int, method: str = "kmedoids", num_iters: int = 5,
                          num_prefix_tokens: int = 1, metric: str = "sqeuclidean"):
    r"""Token Pooling (module docstring): ``x (B, N, C) -> (B, num_prefix_tokens + K, C)``.

    Parameters
    ----------
    x : array (B, N, C)
        Tokens; the first ``num_prefix_tokens`` (class tokens) are kept as they are.
    scores : array (B, N - num_prefix_tokens), optional
        Positive significance weights $w$ of the pooled tokens (weighted clustering, top-$K$
        initialisation); ``None`` for $w \equiv 1$ and farthest-point initialisation.
    num_clusters : int
        $K$, the number of output tokens besides the prefix.
    method : {"kmedoids", "kmeans"}
    num_iters : int
        Maximum Lloyd rounds (5).
    num_prefix_tokens : int
        1 (a ViT/DeiT class token).
    metric : {"sqeuclidean", "euclidean"}
        The distance in the medoid cost (assignments use the nearest centre either way).

    Returns
    -------
    y, cache
        ``y (B, num_prefix_tokens + K, C)``.
    """
    x, w, p, k, it = _config(x, scores, num_clusters, method, num_iters, num_prefix_tokens, metric)
    masks = np.stack([_cluster_one(x[b, p:], w[b], k, method, it, metric, scores is not None)[0]
                      for b in range(x.shape[0])])
    if method == "kmedoids":
        # one token per set: the centre is that token itself (no w_j f_j / w_j round-off)
        coef, wk = masks.astype(x.dtype), None
    else:
        aw = masks * w[:, None, :]                  # (B, K, M): w_i [i in S_k]
        wk = aw.sum(axis=-1, keepdims=True)          # W_k
        coef = aw / wk
    centres = coef @ x[:, p:]
    y = np.concatenate([x[:, :p], centres], axis=1)
    cache = {"x": x, "coef": coef, "wk": wk, "masks": masks, "centres": centres, "p": p,
             "weighted": scores is not None, "out_shape": y.shape}
    return y, cache


def token_pooling_backward(dout, cache):
    r"""Gradients of `token_pooling_forward` with the clustering held fixed: ``{"x"[, "scores"]}``
    (module docstring)."""
    x = cache["x"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    p = cache["p"]
    gc = g[:, p:]                                    # (B, K, C)
    dx = np.zeros_like(x)
    dx[:, :p] = g[:, :p]
    dx[:, p:] = np.swapaxes(cache["coef"], 1, 2) @ gc
    grads = {"x": dx}
    if cache["weighted"] and cache["wk"] is None:     # K-Medoids: a selection, no weight gradient
        grads["scores"] = np.zeros(x.shape[:1] + (x.shape[1] - p,), dtype=x.dtype)
    elif cache["weighted"]:
        # dw_i = sum_k [i in S_k] <f_i - c_k, g_k> / W_k
        f = x[:, p:]
        fg = f @ np.swapaxes(gc, 1, 2)               # (B, M, K): <f_i, g_k>
        cg = np.sum(cache["centres"] * gc, axis=-1)  # (B, K): <c_k, g_k>
        term = (fg - cg[:, None, :]) / np.swapaxes(cache["wk"], 1, 2)
        grads["scores"] = np.sum(np.swapaxes(cache["masks"], 1, 2) * term, axis=-1)
    return grads


def token_pooling(x, scores=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of `token_pooling_forward`."""
    return token_pooling_forward(x, scores, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _blobs(rng, b, k, per, c, spread=0.15, labels=False):
    """``b`` token sets of ``k`` well-separated blobs of ``per`` tokens (shuffled); with ``labels``
    also each token's blob."""
    out, lab = np.empty((b, k * per, c)), np.empty((b, k * per), dtype=int)
    for i in range(b):
        centres = 3.0 * rng.standard_normal((k, c))
        while np.min(_dist(centres, centres, "sqeuclidean") + 1e9 * np.eye(k)) < 4.0:
            centres = 3.0 * rng.standard_normal((k, c))
        perm = rng.permutation(k * per)
        out[i] = (np.repeat(centres, per, axis=0) + spread * rng.standard_normal((k * per, c)))[perm]
        lab[i] = np.repeat(np.arange(k), per)[perm]
    return (out, lab) if labels else out


def _sample(rng, size):
    method = TOKEN_POOLING_METHODS[int(rng.integers(0, 2))]
    weighted = bool(rng.random() < 0.7)
    k, per, c = (2, 3, 3) if size == "tiny" else (3, 4, 5)
    pooled = _blobs(rng, 2, k, per, c)
    x = np.concatenate([rng.standard_normal((2, 1, c)), pooled], axis=1)
    inputs = {"x": x}
    if weighted:
        # distinct scores, >= 0.05 apart: the top-K initialisation is stable under perturbation
        inputs["scores"] = 0.5 + 0.05 * np.stack([rng.permutation(k * per) for _ in range(2)]) + \
            rng.uniform(0, 0.01, (2, k * per))
    return Sample(inputs=inputs, config={"num_clusters": k, "method": method, "num_iters": 5})


def _objective(f, w, centres):
    return float(np.sum(w * np.min(_dist(f, centres, "sqeuclidean"), axis=1)))


def _brute_force_optimum(f, w, k, method):
    # Every assignment of the M tokens to K clusters (K-Means) or every K-subset of medoids.
    import itertools

    m = f.shape[0]
    best = np.inf
    if method == "kmeans":
        for labels in itertools.product(range(k), repeat=m):
            lab = np.array(labels)
            if len(set(labels)) < k:
                continue
            cs = np.stack([w[lab == c] @ f[lab == c] / w[lab == c].sum() for c in range(k)])
            best = min(best, _objective(f, w, cs))
    else:
        for sub in itertools.combinations(range(m), k):
            best = min(best, _objective(f, w, f[list(sub)]))
    return best


def _check_matches_brute_force_optimum(rng):
    # On separated blobs, started with one centre per blob (farthest points; or the top scores
    # placed one per blob), the clustering reaches the global optimum of exhaustive search.
    err = 0.0
    for method in TOKEN_POOLING_METHODS:
        for weighted in (False, True):
            x, lab = _blobs(rng, 2, 2, 3, 2, labels=True)
            w = rng.uniform(0.5, 1.5, x.shape[:2])
            for b in range(2):
                for c in range(2):
                    w[b, np.flatnonzero(lab[b] == c)[0]] = 2.0 + 0.1 * c
            y = token_pooling(x, w if weighted else None, num_clusters=2, method=method, num_prefix_tokens=0)
            for b in range(2):
                wb = w[b] if weighted else np.ones(x.shape[1])
                got, best = _objective(x[b], wb, y[b]), _brute_force_optimum(x[b], wb, 2, method)
                err = max(err, abs(got - best))
    assert err < 1e-12, f"token pooling misses the brute-force optimum (objective gap {err})"
    return err


def _check_fixed_point_by_loops(rng):
    # After convergence: every token sits in its nearest centre's cluster (explicit loops), every
    # K-Means centre is its cluster's weighted mean, every medoid minimises its cluster's cost.
    x = rng.standard_normal((2, 13, 3))
    w = rng.uniform(0.5, 1.5, (2, 12))
    err = 0.0
    for method in TOKEN_POOLING_METHODS:
        y = token_pooling(x, w, num_clusters=4, method=method, num_iters=100)
        masks, assign = token_pooling_clusters(x, w, num_clusters=4, method=method, num_iters=100)
        for b in range(2):
            f, c = x[b, 1:], y[b, 1:]
            for i in range(12):
                d = [float(np.sum((f[i] - c[j]) ** 2)) for j in range(4)]
                assert assign[b, i] == int(np.argmin(d)), "a token is not in its nearest centre's cluster"
            for j in range(4):
                members = [i for i in range(12) if assign[b, i] == j]
                if method == "kmeans":
                    mean = sum(w[b, i] * f[i] for i in members) / sum(w[b, i] for i in members)
                    err = max(err, float(np.abs(mean - c[j]).max()))
                else:
                    costs = [sum(w[b, i] * float(np.sum((f[i] - f[m]) ** 2)) for i in members) for m in members]
                    err = max(err, float(np.abs(f[members[int(np.argmin(costs))]] - c[j]).max()))
    assert err < 1e-12, f"converged clustering is not a Lloyd fixed point (err {err})"
    return err


def _check_permutation_invariance(rng):
    # Shuffling the pooled tokens (and their scores) leaves the output unchanged.
    s = _sample(rng, "small")
    x, w = s.inputs["x"], s.inputs.get("scores")
    perm = 1 + rng.permutation(x.shape[1] - 1)
    xp = np.concatenate([x[:, :1], x[:, perm]], axis=1)
    wp = None if w is None else w[:, perm - 1]
    err = float(np.abs(token_pooling(x, w, **s.config) - token_pooling(xp, wp, **s.config)).max())
    assert err < 1e-13, f"token pooling depends on the token order (err {err})"
    return err


def _check_all_clusters_is_identity_set(rng):
    # K = M: every token is its own cluster; the output is the token set (prefix first).
    x = rng.standard_normal((2, 6, 3))
    w = rng.uniform(0.5, 1.5, (2, 5))
    err = 0.0
    for method in TOKEN_POOLING_METHODS:
        y = token_pooling(x, w, num_clusters=5, method=method)
        order = np.argsort(-w, axis=1, kind="stable")
        err = max(err, float(np.abs(y[:, 1:] - np.take_along_axis(x[:, 1:], order[..., None], axis=1)).max()))
        err = max(err, float(np.abs(y[:, 0] - x[:, 0]).max()))
    assert err < 1e-14, f"K = M does not return the tokens (err {err})"
    return err


register(
    Mechanism(
        slug="token_pooling", family="5-building-blocks", tier="T2",
        official_code="none official; port followed: JoakimHaurum/TokenReduction models/kmedoids.py@88fe07e",
        title="Token Pooling: (weighted) K-Medoids / K-Means token downsampling, selection fixed in the backward",
        paper="Marin, Chang, Ranjan, Prabhu, Rastegari, Tuzel, Token Pooling in Vision Transformers for Image "
              "Classification, WACV 2023, arXiv 2110.03860",
        forward=token_pooling_forward, backward=token_pooling_backward, sample=_sample,
        docs="blocks/vision-token-mixers.md#token-pooling",
        checks={"matches_brute_force_optimum": _check_matches_brute_force_optimum,
                "fixed_point_by_loops": _check_fixed_point_by_loops,
                "permutation_invariance": _check_permutation_invariance,
                "all_clusters_is_identity_set": _check_all_clusters_is_identity_set},
        notes="piecewise smooth: the clustering (initial centres, assignments, medoids) is held fixed in the "
              "backward; the sampler draws separated blobs and distinct scores so no decision flips under the "
              "finite-difference step",
    ),
)
