r"""Synthetic key retrieval: where do plain softmax and differential attention put their mass?

The task
--------
Each episode has $N$ context tokens with unit key codes $c_j\in\mathbb R^{d_k}$ and value labels
$y_j\in\{0..V-1\}$ (values are one-hot, $Y\in\mathbb R^{N\times V}$). One token is the target
$t$; the query is a noisy copy of its code, $x_q = c_t + \sigma\,\xi/\sqrt{d_k}$. ``n_hard``
"hard" distractors have codes correlated with the target, $c_j = \rho\,c_t + \sqrt{1-\rho^2}\,\xi_j$;
the rest are random. The model must return the target's value label.

The two models (one head, same budget)
--------------------------------------
Queries and keys are L2-normalised after their projections and the score scale is a fixed
temperature $\tau$ (cosine attention), so no model can make its softmax arbitrarily sharp — a
bounded-logit setting in which softmax keeps a floor of mass on every distractor:

* plain: $A = \mathrm{softmax}(\tau\,\hat q\hat K^\top)$ with $\hat q = \mathrm{n}(x_qW_q)$,
  $\hat K = \mathrm{n}(CW_k)$, computed by :func:`refattn.attention.softmax.sdpa_forward`;
* differential: two such maps $A_1, A_2$ (own $W_{q1}, W_{k1}, W_{q2}, W_{k2}$) and a learned
  scalar $\lambda$, $D = A_1 - \lambda A_2$, computed by
  :func:`refattn.attention.differential.diff_attention_core_forward` (the DIFF V1 core).

Both read out $\hat y = g\,(\text{map})\,Y$ with a learned gain $g$ and are **trained** (not
constructed) on the same stream of episodes with the squared error
$L = \frac1E\sum_e\lVert \hat y_e - \mathrm{onehot}(y_{t_e})\rVert^2$, using refattn's own
backward passes (``sdpa_backward``, ``diff_attention_core_backward``, plus the two small VJPs
derived below) and :class:`refattn.optim.Adam`. Everything is NumPy; the default configuration
trains both models in a few seconds on one core.

The measurable claim (checked by ``tests/test_demo_retrieval.py``)
-----------------------------------------------------------------
On held-out episodes the differential map puts a smaller share of its absolute mass on
distractors, $\mathrm{share} = \sum_{j\ne t}|D_j| / \sum_j |D_j|$ (for the plain map $1 - A_t$),
and retrieves the label at least as accurately. Signed maps are compared by absolute mass so that
over-subtraction (negative entries) counts against the differential model.

Backward of the pieces around the attention cores
--------------------------------------------------
* Readout: $\hat y = gO$, $dO = g\,d\hat y$, $dg = \langle d\hat y, O\rangle$ with
  $d\hat y = 2(\hat y - \mathrm{onehot})/E$.
* L2 normalisation $\hat u = u/\lVert u\rVert$: $du = (d\hat u - \hat u\,(\hat u\cdot d\hat u))/\lVert u\rVert$.
* Projections $u = xW$: $dW = x^\top du$ (summed over episodes and tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..attention.differential import diff_attention_core_backward, diff_attention_core_forward
from ..attention.softmax import sdpa_backward, sdpa_forward
from ..optim import Adam

__all__ = [
    "RetrievalConfig",
    "RetrievalData",
    "make_retrieval_data",
    "init_params",
    "forward",
    "loss_and_grads",
    "train",
    "attention_maps",
    "distractor_share",
    "column_order",
    "evaluate",
    "run_demo",
]

KINDS = ("plain", "diff")


@dataclass(frozen=True)
class RetrievalConfig:
    """Task and training sizes (defaults: both models train in a few seconds on one core)."""

    n_tokens: int = 48
    d_key: int = 16
    n_values: int = 16
    n_hard: int = 4
    rho: float = 0.7
    query_noise: float = 0.5
    tau: float = 4.0
    batch: int = 64
    steps: int = 400
    lr: float = 0.02
    init_noise: float = 0.3


@dataclass
class RetrievalData:
    """A batch of episodes. ``query (E, 1, d_k)``, ``keys (E, N, d_k)``, ``values (E, N, V)``
    one-hot, ``target (E,)`` target position, ``label (E,)`` its value label, ``hard (E, N)``
    hard-distractor flags."""

    query: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    target: np.ndarray
    label: np.ndarray
    hard: np.ndarray = field(repr=False)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make_retrieval_data(n_episodes: int, config: RetrievalConfig = RetrievalConfig(), *,
                        rng: np.random.Generator | int = 0) -> RetrievalData:
    """Draw ``n_episodes`` episodes of the task described in the module docstring."""
    rng = np.random.default_rng(rng)
    cfg = config
    if cfg.n_hard >= cfg.n_tokens:
        raise ValueError(f"n_hard ({cfg.n_hard}) must be smaller than n_tokens ({cfg.n_tokens})")
    e, n, dk = int(n_episodes), cfg.n_tokens, cfg.d_key
    c = _unit(rng.standard_normal((e, n, dk)))
    t = rng.integers(0, n, e)
    ct = c[np.arange(e), t]
    hard = np.zeros((e, n), dtype=bool)
    for i in range(e):
        others = np.delete(np.arange(n), t[i])
        h = rng.choice(others, cfg.n_hard, replace=False)
        hard[i, h] = True
        xi = _unit(rng.standard_normal((cfg.n_hard, dk)))
        c[i, h] = cfg.rho * ct[i] + np.sqrt(1 - cfg.rho**2) * xi
    y = rng.integers(0, cfg.n_values, (e, n))
    q = ct + cfg.query_noise * rng.standard_normal((e, dk)) / np.sqrt(dk)
    return RetrievalData(query=q[:, None, :], keys=c, values=np.eye(cfg.n_values)[y], target=t,
                         label=y[np.arange(e), t], hard=hard)


def init_params(kind: str, config: RetrievalConfig = RetrievalConfig(), *,
                rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Near-identity projections (the raw codes already match), gain 1, and for ``"diff"`` λ = 0.5."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    rng = np.random.default_rng(rng)
    dk = config.d_key

    def w():
        return np.eye(dk) + config.init_noise * rng.standard_normal((dk, dk))

    names = ("wq", "wk") if kind == "plain" else ("wq1", "wk1", "wq2", "wk2")
    params = {name: w() for name in names}
    if kind == "diff":
        params["lam"] = np.array([0.5])
    params["gain"] = np.array(1.0)
    return params


def _l2n(u):
    n = np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-12)
    return u / n, n


def _l2n_vjp(g, uh, n):
    return (g - uh * np.sum(g * uh, axis=-1, keepdims=True)) / n


def forward(kind: str, params: dict, data: RetrievalData, config: RetrievalConfig = RetrievalConfig()):
    r"""Prediction $\hat y$ ``(E, V)`` and a cache holding the attention maps.

    ``cache["maps"]``: ``{"plain": A}`` or ``{"a1": A_1, "a2": A_2, "diff": A_1 - λA_2}``, each ``(E, N)``.
    """
    x, c, yv = data.query, data.keys, data.values
    cache = {"kind": kind}
    if kind == "plain":
        qh, nq = _l2n(x @ params["wq"])
        kh, nk = _l2n(c @ params["wk"])
        o, core = sdpa_forward(qh[:, None], kh[:, None], yv[:, None], scale=config.tau)
        cache["norm"] = {"": (qh, nq, kh, nk)}
        cache["maps"] = {"plain": core["p"][:, 0, 0]}
    elif kind == "diff":
        parts = {}
        for a in ("1", "2"):
            qh, nq = _l2n(x @ params["wq" + a])
            kh, nk = _l2n(c @ params["wk" + a])
            parts[a] = (qh, nq, kh, nk)
        o, core = diff_attention_core_forward(parts["1"][0][:, None], parts["1"][2][:, None], parts["2"][0][:, None],
                                              parts["2"][2][:, None], yv[:, None], params["lam"], scale=config.tau)
        cache["norm"] = parts
        a1, a2 = core["p1"][:, 0, 0], core["p2"][:, 0, 0]
        cache["maps"] = {"a1": a1, "a2": a2, "diff": a1 - params["lam"] * a2}
    else:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    o = o[:, 0, 0]
    cache.update(core=core, o=o)
    return params["gain"] * o, cache


def loss_and_grads(kind: str, params: dict, data: RetrievalData, config: RetrievalConfig = RetrievalConfig()):
    """Squared-error loss and its gradient for every parameter (backward derived in the module docstring)."""
    pred, cache = forward(kind, params, data, config)
    err = pred - np.eye(config.n_values)[data.label]
    e = len(err)
    loss = float(np.sum(err**2) / e)
    dpred = 2.0 * err / e
    o = cache["o"]
    grads = {"gain": np.array(np.sum(dpred * o))}
    do = (params["gain"] * dpred)[:, None, None]
    x2 = data.query.reshape(-1, config.d_key)
    c2 = data.keys.reshape(-1, config.d_key)
    if kind == "plain":
        g = sdpa_backward(do, cache["core"])
        pairs = {"": (g["q"][:, 0], g["k"][:, 0])}
    else:
        g = diff_attention_core_backward(do, cache["core"])
        grads["lam"] = g["lam"]
        pairs = {a: (g["q" + a][:, 0], g["k" + a][:, 0]) for a in ("1", "2")}
    for a, (dqh, dkh) in pairs.items():
        qh, nq, kh, nk = cache["norm"][a]
        dq = _l2n_vjp(dqh, qh, nq).reshape(-1, config.d_key)
        dk = _l2n_vjp(dkh, kh, nk).reshape(-1, config.d_key)
        grads["wq" + a] = x2.T @ dq
        grads["wk" + a] = c2.T @ dk
    return loss, grads


def train(kind: str, config: RetrievalConfig = RetrievalConfig(), *, seed: int = 0):
    """Train one model with :class:`refattn.optim.Adam` on fresh episodes every step.

    Returns ``(params, losses)``. Both models see the same episode stream for a given ``seed``.
    """
    params = init_params(kind, config, rng=seed)
    opt = Adam(params, lr=config.lr)
    stream = np.random.default_rng(seed + 1)
    losses = []
    for _ in range(config.steps):
        data = make_retrieval_data(config.batch, config, rng=stream)
        loss, grads = loss_and_grads(kind, params, data, config)
        opt.step(grads)
        losses.append(loss)
    return params, np.asarray(losses)


def attention_maps(kind: str, params: dict, data: RetrievalData, config: RetrievalConfig = RetrievalConfig()):
    """The attention maps ``(E, N)`` of a model on ``data`` (see :func:`forward`)."""
    return forward(kind, params, data, config)[1]["maps"]


def distractor_share(row_maps: np.ndarray, target: np.ndarray) -> np.ndarray:
    r"""Per episode $\sum_{j\ne t}|a_j| / \sum_j|a_j|$ of a (possibly signed) map ``(E, N)``."""
    absm = np.abs(row_maps)
    at = absm[np.arange(len(target)), target]
    return 1.0 - at / absm.sum(-1)


def column_order(data: RetrievalData) -> np.ndarray:
    """Per-episode column permutation ``(E, N)`` for readable heat maps: target first, then the
    hard distractors, then the rest (each group in position order). Apply it with
    ``np.take_along_axis(maps, order, axis=-1)``."""
    n = data.keys.shape[1]
    pos = np.broadcast_to(np.arange(n), data.hard.shape)
    is_t = pos == data.target[:, None]
    rank = np.where(is_t, 0, np.where(data.hard, 1, 2)) * n + pos
    return np.argsort(rank, axis=-1, kind="stable")


def evaluate(kind: str, params: dict, data: RetrievalData, config: RetrievalConfig = RetrievalConfig()) -> dict:
    """Mean distractor share, mean share on hard distractors, and retrieval accuracy."""
    pred, cache = forward(kind, params, data, config)
    m = cache["maps"]["plain" if kind == "plain" else "diff"]
    absm = np.abs(m)
    return {"distractor_share": float(distractor_share(m, data.target).mean()),
            "hard_share": float((np.sum(absm * data.hard, -1) / absm.sum(-1)).mean()),
            "accuracy": float(np.mean(np.argmax(pred, -1) == data.label))}


def run_demo(config: RetrievalConfig = RetrievalConfig(), *, seed: int = 0, n_eval: int = 512) -> dict:
    """Train both models and evaluate them on the same held-out episodes.

    Returns a dict with ``config``, ``params`` (``{"plain": ..., "diff": ...}``), ``losses``,
    ``data`` (held-out :class:`RetrievalData`), ``maps`` (``{"plain": A, "a1": A_1, "a2": A_2,
    "diff": D}``, each ``(n_eval, N)``, ready for heat maps) and ``metrics`` per model.
    """
    params, losses, metrics, maps = {}, {}, {}, {}
    data = make_retrieval_data(n_eval, config, rng=np.random.default_rng(10_000 + seed))
    for kind in KINDS:
        params[kind], losses[kind] = train(kind, config, seed=seed)
        metrics[kind] = evaluate(kind, params[kind], data, config)
        maps.update(attention_maps(kind, params[kind], data, config))
    return {"config": config, "params": params, "losses": losses, "data": data, "maps": maps, "metrics": metrics}
