r"""MRA-2: multiresolution (two-level) approximation of softmax self-attention.

Zeng, Pal, Kline, Fung, Singh, "Multi Resolution Analysis (MRA) for Approximate Self-Attention",
ICML 2022, arXiv 2207.10284. Follows mlpen/mra-attention
``src/roberta/models/postnorm_efficient_attentions/mra2_kernel/attention.py``
(``get_low_resolution_logit``, ``get_block_idxes``, ``mra2_attention``), ``kernel.py`` and ``mra2.py``
@``7e08afeb6f34dcb15a7812f45d66e42d9a21bbc5``.

The approximation (per batch element and head)
----------------------------------------------
Cut the $N$ positions into $n_b = N/b$ blocks of $b$ (``block_size``). Coarse resolution: block means
$\hat q_I, \hat k_J, \hat v_J$ and logits $\Lambda_{IJ} = s\,\hat q_I\cdot\hat k_J$ ($s = d^{-1/2}$), row
maxima $\mu_I = \max_J\Lambda_{IJ}$. Refinement: the ``num_blocks`` block pairs $(I, J)$ of largest
$\Lambda_{IJ} - \mu_I$ (+ $5\cdot10^3$ for the optional priors: diagonal band, first blocks) over the
whole $n_b\times n_b$ grid form the set $\mathcal S$; they get full-resolution logits
$s_{ij} = s\,q_i\cdot k_j$. The approximate attention matrix is

$$\hat A_{ij} = \begin{cases} e^{s_{ij}} & (I, J)\in\mathcal S\\
e^{\Lambda_{IJ}} & \text{otherwise (``full''; 0 for ``sparse'', MRA-2-s)}\end{cases}\qquad
o_i = \frac{\sum_j\hat A_{ij}v_j}{\sum_j\hat A_{ij} + \epsilon\,e^{c_i}},$$

($i\in I$, $j\in J$), with $c_i = \max(\mu_I, M_i)$, $M_i = \max_{j:(I,J)\in\mathcal S}s_{ij}$ (for
``sparse`` $c_i = M_i$; a query without refined blocks gets 0 there). The stabiliser $c_i$ is what the
code factors out of numerator and denominator, so it survives only through the $\epsilon = 10^{-6}$
guard; with ``eps=0`` it cancels exactly. That $N\times N$ formula is the record's explicit reference.
The fast form (this module's forward, upstream's): the coarse part is
$\sum_{J\notin\mathcal S_I} b\,e^{\Lambda_{IJ}}\hat v_J$ — an $n_b\times n_b$ computation, since all $b$
keys of block $J$ share one weight — and the refined part touches only the $|\mathcal S|\,b^2$
selected entries. Cost $O(n_b^2d + |\mathcal S|b^2d)$. Refining every block pair, or $b = 1$, gives
exact softmax attention (up to $\epsilon$).

Backward (selection held fixed)
-------------------------------
With $g_i = \partial L/\partial o_i$ and $D_i$ the denominator, each weight $w$ of $\hat A$ (scaled by
$e^{-c_i}$) with value row $u$ ($v_j$ or $\hat v_J$) gets $\partial L/\partial\log w = (w/D_i)\,g_i\cdot(u - o_i)$
and $du \mathrel{+}= (w/D_i)\,g_i$. So $ds_{ij}$ follows for refined entries and
$d\Lambda_{IJ} \mathrel{+}= \sum_{i\in I}b\,e^{\Lambda_{IJ}-c_i}D_i^{-1}g_i\cdot(\hat v_J - o_i)$ for coarse
ones, $d\hat v_J \mathrel{+}= \sum_{i\in I} b\,e^{\Lambda_{IJ}-c_i}D_i^{-1}g_i$. The guard gives
$dc_i = -\epsilon\,g_i\cdot o_i/D_i$, routed to the arg-max of $c_i$ ($\Lambda_{IJ^*}$ or $s_{ij^*}$).
Then $dq_i \mathrel{+}= s\sum_j ds_{ij}k_j$, $dk_j \mathrel{+}= s\sum_i ds_{ij}q_i$,
$d\hat q_I = s\sum_J d\Lambda_{IJ}\hat k_J$, $d\hat k_J = s\sum_I d\Lambda_{IJ}\hat q_I$, and the block
means spread $1/b$ of their gradient to each member. The selection, its priors and the row maxima used
for ranking get no gradient (upstream computes them under ``no_grad``).

Conventions
-----------
``block_size`` 32 upstream (any divisor of $N$ here); ``num_blocks`` as upstream's ``num_block``
(``attention_block_per_row * N / 32`` in the configs, capped at $n_b^2$); ``num_blocks = 0`` (every
pair coarse, ``full`` only) is allowed here for resolution studies — upstream's ``topk`` cannot take it.
``approx_mode`` ``"full"`` (MRA-2) or ``"sparse"`` (MRA-2-s); priors
``initial_prior_first_n_blocks``, ``initial_prior_diagonal_n_blocks`` (0 by default; the 4k configs
use 1 and 5); ``eps`` = 1e-6; ``scale`` default $d^{-1/2}$. Not implemented: the key padding mask and
the 2-D ``input_shape`` token reordering (both outside the approximation itself).

Deviations from upstream (stabiliser only): the CUDA ``index_max`` kernel computes $M_i$ on
``int(1000 x)`` (truncated to $10^{-3}$) and treats it as a constant in autograd, while the row max
$\mu_I$ is differentiated; here $M_i$ is exact and both maxima are differentiated (the function is
$C^\infty$ away from ties, and the finite-difference check needs the exact derivative). Both change
the result only through $\epsilon e^{c_i}$: about $10^{-9}$ relative in the forward (the
quantisation) and terms of order $\epsilon/D_i$ in the gradients (the dropped derivative; measured
below).

Agreement with upstream: the CUDA kernels cannot run here, so ``mra2_attention`` was transcribed to
PyTorch with the kernels' pure-torch twins from ``kernel.py`` (``mm_to_sparse_torch``,
``sparse_dense_mm_torch``, ``reduce_sum_torch``, the custom ``SampledDenseMM``/``SparseDenseMM``
backward formulas) and an exact, non-differentiated ``sparse_max``; 16 configurations (full and
sparse, priors on and off, $b = 4, 8$, ``eps`` 0 and 1e-6): output 1.8e-15; gradients 9.5e-16
relative with ``eps=0``, 4.3e-6 relative with upstream's ``eps=1e-6`` — exactly the dropped
stabiliser gradient: with ``sparse_max`` differentiated in the transcription the gradients agree to
2.0e-15.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice, check_int, check_positive
from ...registry import Mechanism, Sample, register
from ._samples import draw_until, softmax_attention_reference, topk_margin
from .core import mT, validate_linear_qkv

__all__ = ["MRA_MODES", "mra_block_scores", "mra_block_selection", "mra_attention_forward", "mra_attention_backward",
           "mra_attention"]

MRA_MODES = ("full", "sparse")
_PRIOR = 5e3


def _block_means(x, nb, b):
    return x.reshape(x.shape[:-2] + (nb, b, x.shape[-1])).mean(axis=-2)


def mra_block_scores(q, k, block_size: int, scale: float, first_n: int = 0, diagonal_n: int = 0):
    r"""Coarse logits $\Lambda$ ``(..., n_b, n_b)``, row maxima $\mu$ ``(..., n_b)`` and the ranking
    scores $\Lambda - \mu$ + priors used to select the refined blocks (unvalidated)."""
    nb = q.shape[-2] // block_size
    lam = scale * (_block_means(q, nb, block_size) @ mT(_block_means(k, nb, block_size)))
    mu = np.max(lam, axis=-1)
    score = lam - mu[..., None]
    if diagonal_n > 0:
        off = diagonal_n // 2
        ii, jj = np.meshgrid(np.arange(nb), np.arange(nb), indexing="ij")
        score = score + _PRIOR * (np.abs(ii - jj) <= off)
    if first_n > 0:
        score = score.copy()
        score[..., :first_n, :] += _PRIOR
        score[..., :, :first_n] += _PRIOR
    return lam, mu, score


def mra_block_selection(score: np.ndarray, num_blocks: int):
    """Row and column block indices ``(I, J)``, each ``(..., num_blocks)``, of the ``num_blocks`` largest
    ranking scores over the flattened block grid (upstream ``torch.topk`` over ``n_b * n_b``)."""
    nb = score.shape[-1]
    flat = score.reshape(score.shape[:-2] + (nb * nb,))
    if num_blocks == 0:
        idx = np.zeros(flat.shape[:-1] + (0,), dtype=np.int64)
    elif num_blocks >= nb * nb:
        idx = np.broadcast_to(np.arange(nb * nb), flat.shape).copy()
    else:
        idx = np.sort(np.argpartition(-flat, num_blocks - 1, axis=-1)[..., :num_blocks], axis=-1)
    return idx // nb, idx % nb


def _gather_blocks(xb, idx):
    """``xb (G, n_b, b, e)``, ``idx (G, k)`` -> ``(G, k, b, e)``."""
    return np.take_along_axis(xb, idx[:, :, None, None], axis=1)


def _scatter_blocks(vals, idx, nb):
    """Adjoint of `_gather_blocks`: ``vals (G, k, b, e)`` added into block rows ``idx`` of ``(G, n_b, b, e)``."""
    out = np.zeros((vals.shape[0], nb) + vals.shape[2:], dtype=vals.dtype)
    np.add.at(out, (np.arange(vals.shape[0])[:, None], idx), vals)
    return out


def _validate(q, k, v, num_blocks, block_size, approx_mode, first_n, diagonal_n, eps, scale):
    q, k, v = validate_linear_qkv(q, k, v, same_length=True)
    b = check_int(block_size, "block_size", minimum=1)
    n = q.shape[-2]
    if n % b:
        raise ValueError(f"the sequence length of q (axis -2, {n}) must be a multiple of block_size={b}")
    nb = n // b
    num_blocks = check_int(num_blocks, "num_blocks", minimum=0)
    check_choice(approx_mode, "approx_mode", MRA_MODES)
    if approx_mode == "sparse" and num_blocks == 0:
        raise ValueError("num_blocks must be >= 1 with approx_mode='sparse' (no refined block leaves no attention)")
    first_n = check_int(first_n, "initial_prior_first_n_blocks", minimum=0)
    diagonal_n = check_int(diagonal_n, "initial_prior_diagonal_n_blocks", minimum=0)
    eps = check_positive(eps, "eps", allow_zero=True)
    scale = check_positive(scale, "scale", allow_none=True)
    s = float(q.shape[-1] ** -0.5) if scale is None else scale
    return q, k, v, min(num_blocks, nb * nb), b, nb, first_n, diagonal_n, eps, s


def mra_attention_forward(q, k, v, *, num_blocks: int, block_size: int = 32, approx_mode: str = "full",
                          initial_prior_first_n_blocks: int = 0, initial_prior_diagonal_n_blocks: int = 0,
                          eps: float = 1e-6, scale=None):
    r"""MRA-2 approximate self-attention (upstream ``mra2_attention``).

    Parameters
    ----------
    q, k, v : (..., N, d)
        Equal leading axes (``(B, H)``), one length ``N`` (a multiple of ``block_size``).
    num_blocks : int >= 0
        Refined block pairs per (batch, head), over the whole $n_b\times n_b$ grid (capped at $n_b^2$).
    block_size : int
        $b$ (upstream 32).
    approx_mode : {"full", "sparse"}
        Coarse blocks at low resolution (MRA-2) or dropped (MRA-2-s).
    initial_prior_first_n_blocks, initial_prior_diagonal_n_blocks : int
        Selection priors (first block rows/columns; a diagonal band of this width).
    eps : float >= 0
        The denominator guard (upstream 1e-6).
    scale : float > 0, optional
        Default $d^{-1/2}$.

    Returns
    -------
    out : (..., N, d), cache
    """
    q, k, v, nsel, b, nb, first_n, diag_n, eps, s = _validate(
        q, k, v, num_blocks, block_size, approx_mode, initial_prior_first_n_blocks,
        initial_prior_diagonal_n_blocks, eps, scale)
    lead, n = q.shape[:-2], q.shape[-2]
    dv = v.shape[-1]
    qg, kg, vg = (a.reshape((-1, n, a.shape[-1])) for a in (q, k, v))
    gsz = qg.shape[0]
    lam, mu, score = mra_block_scores(qg, kg, b, s, first_n, diag_n)
    bi, bj = mra_block_selection(score, nsel)
    qb, kb, vb = (a.reshape(gsz, nb, b, a.shape[-1]) for a in (qg, kg, vg))
    qs, ks, vs = _gather_blocks(qb, bi), _gather_blocks(kb, bj), _gather_blocks(vb, bj)
    hs = s * (qs @ mT(ks))  # (G, k, b, b): refined logits, [query, key]
    blockmax = np.max(hs, axis=-1) if nsel else np.zeros((gsz, 0, b))  # (G, k, b)
    big_m = np.full((gsz, nb, b), -np.inf, dtype=q.dtype)
    if nsel:
        np.maximum.at(big_m, (np.arange(gsz)[:, None], bi), blockmax)
    full = approx_mode == "full"
    c = np.maximum(mu[..., None], big_m) if full else big_m  # (G, nb, b)
    has = np.isfinite(c)
    c_safe = np.where(has, c, 0.0)
    w = np.exp(hs - np.take_along_axis(c_safe, bi[:, :, None], axis=1)[..., None])  # (G, k, b, b)
    num = _scatter_blocks(w @ vs, bi, nb)  # (G, nb, b, dv)
    den = _scatter_blocks(np.sum(w, axis=-1)[..., None], bi, nb)[..., 0]  # (G, nb, b)
    sel = np.zeros((gsz, nb, nb), dtype=bool)
    sel[np.arange(gsz)[:, None], bi, bj] = True
    vhat = _block_means(vg, nb, b)  # (G, nb, dv)
    if full:
        a_low = np.where(sel, 0.0, b * np.exp(lam - mu[..., None]))  # (G, nb, nb), scaled by e^{-mu_I}
        corr = np.exp(mu[..., None] - c_safe)  # (G, nb, b)
        num = num + corr[..., None] * (a_low @ vhat)[:, :, None, :]
        den = den + corr * np.sum(a_low, axis=-1)[..., None]
    den_tot = den + eps
    out = np.where(has[..., None], num / np.where(has, den_tot, 1.0)[..., None], 0.0)
    out = out.reshape(lead + (n, dv))
    cache = {"qg": qg, "kg": kg, "vg": vg, "lam": lam, "mu": mu, "bi": bi, "bj": bj, "hs": hs, "w": w,
             "blockmax": blockmax, "big_m": big_m, "c": c_safe, "has": has, "sel": sel, "vhat": vhat,
             "den": den_tot, "out": out.reshape(gsz, nb, b, dv).copy(), "full": full, "eps": eps, "scale": s,
             "b": b, "nb": nb, "out_shape": out.shape, "shapes": (q.shape, k.shape, v.shape)}
    return out, cache


def mra_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of `mra_attention_forward` with the refined set held fixed (module
    docstring: weight-wise quotient rule, guard term routed to the stabiliser's arg-max, block-mean
    adjoints)."""
    o, den, has = cache["out"], cache["den"], cache["has"]
    gsz, nb, b, dv = o.shape
    g = as_dout(dout, cache["out_shape"], o.dtype).reshape(o.shape)
    g = np.where(has[..., None], g, 0.0)
    bi, bj, w, hs = cache["bi"], cache["bj"], cache["w"], cache["hs"]
    s, eps, full = cache["scale"], cache["eps"], cache["full"]
    qg, kg, vg, lam, mu, vhat = cache["qg"], cache["kg"], cache["vg"], cache["lam"], cache["mu"], cache["vhat"]
    gd = g / den[..., None]  # g_i / D_i
    god = np.sum(gd * o, axis=-1)  # g_i . o_i / D_i
    # refined entries: ds = w (g_i.v_j - g_i.o_i) / D_i, dv_j += w g_i / D_i
    gd_s = _gather_blocks(gd, bi)  # (G, k, b, dv)
    god_s = np.take_along_axis(god, bi[:, :, None], axis=1)  # (G, k, b)
    vs = _gather_blocks(vg.reshape(gsz, nb, b, dv), bj)
    ds = w * (gd_s @ mT(vs) - god_s[..., None])
    dvs = mT(w) @ gd_s
    dmu = np.zeros_like(mu)
    dlam = np.zeros_like(lam)
    dvhat = np.zeros_like(vhat)
    dc = -eps * god  # (G, nb, b)
    if full:
        corr = np.exp(mu[..., None] - cache["c"])  # (G, nb, b)
        a_low = np.where(cache["sel"], 0.0, b * np.exp(lam - mu[..., None]))
        # coarse weight of (i, J): a_low[I, J] corr_i; its log-gradient summed over i in I
        t1 = np.einsum("gIb,gIbe,gJe->gIJ", corr, gd, vhat)  # sum_i corr_i g_i.vhat_J / D_i
        t2 = np.sum(corr * god, axis=-1)  # sum_i corr_i g_i.o_i / D_i
        dlam = a_low * (t1 - t2[..., None])
        dvhat = mT(a_low) @ np.sum(corr[..., None] * gd, axis=2)
    # the guard's stabiliser c_i = max(mu_I, M_i) (sparse: M_i)
    big_m = cache["big_m"]
    to_mu = (mu[..., None] >= big_m) if full else np.zeros_like(has)
    dmu = dmu + np.sum(np.where(to_mu, dc, 0.0), axis=-1)
    if full:
        jstar = np.argmax(lam, axis=-1)
        np.put_along_axis(dlam, jstar[..., None], np.take_along_axis(dlam, jstar[..., None], axis=-1)
                          + dmu[..., None], axis=-1)
    if bi.shape[1]:
        dc_m = np.where(to_mu | ~has, 0.0, dc)  # goes to the refined arg-max M_i
        win = cache["blockmax"] == np.take_along_axis(big_m, bi[:, :, None], axis=1)  # (G, k, b)
        amax = np.argmax(hs, axis=-1)  # (G, k, b)
        add = np.where(win, np.take_along_axis(dc_m, bi[:, :, None], axis=1), 0.0)
        onehot = (amax[..., None] == np.arange(b)).astype(ds.dtype)
        ds = ds + add[..., None] * onehot
    qs = _gather_blocks(qg.reshape(gsz, nb, b, -1), bi)
    ks = _gather_blocks(kg.reshape(gsz, nb, b, -1), bj)
    dq = _scatter_blocks(s * (ds @ ks), bi, nb).reshape(qg.shape)
    dk = _scatter_blocks(s * (mT(ds) @ qs), bj, nb).reshape(kg.shape)
    dv = _scatter_blocks(dvs, bj, nb).reshape(vg.shape)
    qhat, khat = _block_means(qg, nb, b), _block_means(kg, nb, b)
    dqhat, dkhat = s * (dlam @ khat), s * (mT(dlam) @ qhat)
    dq = dq + np.repeat(dqhat / b, b, axis=1)
    dk = dk + np.repeat(dkhat / b, b, axis=1)
    dv = dv + np.repeat(dvhat / b, b, axis=1)
    qs_, ks_, vs_ = cache["shapes"]
    return {"q": dq.reshape(qs_), "k": dk.reshape(ks_), "v": dv.reshape(vs_)}


def mra_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of `mra_attention_forward`."""
    return mra_attention_forward(q, k, v, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(q, k, v, *, num_blocks, block_size=32, approx_mode="full", initial_prior_first_n_blocks=0,
               initial_prior_diagonal_n_blocks=0, eps=1e-6, scale=None):
    """The dense N x N matrix A-hat from its definition: block means by loops, the refined set by a
    Python sort of the ranking scores, the stabiliser c_i, one division per query."""
    n, d = q.shape[-2], q.shape[-1]
    b = block_size
    nb = n // b
    s = d ** -0.5 if scale is None else scale
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(*q.shape[:-2]):
        qq, kk, vv = q[idx], k[idx], v[idx]
        qh = np.array([qq[i * b:(i + 1) * b].mean(0) for i in range(nb)])
        kh = np.array([kk[i * b:(i + 1) * b].mean(0) for i in range(nb)])
        lam = s * qh @ kh.T
        mu = lam.max(1)
        ranked = []
        for bi in range(nb):
            for bj in range(nb):
                sc = lam[bi, bj] - mu[bi]
                if abs(bi - bj) <= initial_prior_diagonal_n_blocks // 2 and initial_prior_diagonal_n_blocks > 0:
                    sc += _PRIOR
                sc += _PRIOR * (bi < initial_prior_first_n_blocks) + _PRIOR * (bj < initial_prior_first_n_blocks)
                ranked.append((sc, bi, bj))
        chosen = {(bi, bj) for _, bi, bj in sorted(ranked, reverse=True)[:num_blocks]}
        for i in range(n):
            bi = i // b
            a = np.zeros(n)
            refined = [j for j in range(n) if (bi, j // b) in chosen]
            for j in range(n):
                if (bi, j // b) in chosen:
                    a[j] = s * qq[i] @ kk[j]
                elif approx_mode == "full":
                    a[j] = lam[bi, j // b]
                else:
                    a[j] = -np.inf
            big_m = max((a[j] for j in refined), default=-np.inf)
            c = max(mu[bi], big_m) if approx_mode == "full" else big_m
            if not np.isfinite(c):
                continue
            e = np.exp(a - c)
            out[idx + (i,)] = e @ vv / (e.sum() + eps)
    return out


def _draw(rng, size, approx_mode=None, priors=None):
    """A sample whose refined set and stabiliser arg-max are away from ties. Some configurations
    make a tie structural (prior blocks share one ranking score, so with ``num_blocks`` landing
    inside them no draw has a margin): the configuration is then drawn again."""
    for _ in range(50):
        try:
            return _draw_once(rng, size, approx_mode, priors)
        except RuntimeError:
            continue
    raise RuntimeError("mra sampler: no configuration with a tie-free draw in 50 tries")


def _draw_once(rng, size, approx_mode, priors):
    b = 2 if size == "tiny" else 4
    nb = 3 if size == "tiny" else int(rng.integers(3, 5))
    d = 2 if size == "tiny" else 4
    shape = (2, 2) if size == "tiny" else (2, 3)
    approx_mode = MRA_MODES[int(rng.integers(0, 2))] if approx_mode is None else approx_mode
    priors = bool(rng.integers(0, 2)) if priors is None else priors
    first_n, diag_n = (1, 3) if priors else (0, 0)
    num_blocks = nb + int(rng.integers(1, 3)) + (2 * nb if priors else 0)
    num_blocks = min(num_blocks, nb * nb - 1)
    s = d ** -0.5

    def draw(r):
        return tuple(r.standard_normal(shape + (nb * b, d)) * (1.5 if i < 2 else 1.0) for i in range(3))

    def margin(qkv):
        q, k, _ = qkv
        lam, _, score = mra_block_scores(q, k, b, s, first_n, diag_n)
        flat = score.reshape(score.shape[:-2] + (-1,))
        lam_sorted = -np.sort(-lam, axis=-1)  # row-max ties would make the stabiliser's arg-max ambiguous
        return min(topk_margin(flat, num_blocks), float(np.min(lam_sorted[..., 0] - lam_sorted[..., 1])))

    q, k, v = draw_until(rng, draw, margin, 0.05, tries=200)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"num_blocks": num_blocks, "block_size": b, "approx_mode": approx_mode,
                          "initial_prior_first_n_blocks": first_n, "initial_prior_diagonal_n_blocks": diag_n})


def _sample(rng, size):
    return _draw(rng, size)


def _check_selection_brute_force(rng):
    """The refined set equals a Python sort of every (I, J) ranking score, priors included."""
    for trial in range(3):
        s = _draw(rng, "small", priors=bool(trial % 2))
        cfg = s.config
        q, k = s.inputs["q"], s.inputs["k"]
        _, _, score = mra_block_scores(q, k, cfg["block_size"], q.shape[-1] ** -0.5,
                                       cfg["initial_prior_first_n_blocks"], cfg["initial_prior_diagonal_n_blocks"])
        bi, bj = mra_block_selection(score, cfg["num_blocks"])
        for idx in np.ndindex(*score.shape[:-2]):
            nb = score.shape[-1]
            want = sorted(((score[idx][x, y], x, y) for x in range(nb) for y in range(nb)), reverse=True)
            want = {(x, y) for _, x, y in want[:cfg["num_blocks"]]}
            assert set(zip(bi[idx].tolist(), bj[idx].tolist())) == want, "refined set differs from a sort"
    return 0.0


def _check_all_refined_is_softmax(rng):
    """Refining every block pair (or b = 1) with eps = 0 is exact softmax attention."""
    q, k, v = (rng.standard_normal((2, 2, 12, 3)) for _ in range(3))
    exact = softmax_attention_reference(q, k, v)
    err = 0.0
    for mode in MRA_MODES:
        err = max(err, float(np.max(np.abs(mra_attention(q, k, v, num_blocks=9, block_size=4, approx_mode=mode,
                                                          eps=0.0) - exact))))
    err = max(err, float(np.max(np.abs(mra_attention(q, k, v, num_blocks=0, block_size=1, eps=0.0) - exact))))
    assert err < 1e-12, f"fully refined MRA differs from softmax attention by {err}"
    return err


def _smooth_signal(rng, n, d, noise=0.0, amp=1.0):
    """Low-frequency functions of the position (3 cosines per channel) plus optional white noise: ``(1, 1, n, d)``."""
    t = (np.arange(n) + 0.5) / n
    a, ph = rng.standard_normal((3, d)), rng.uniform(0, 2 * np.pi, (3, d))
    sig = amp * np.sum(a[None] * np.cos(2 * np.pi * np.arange(1, 4)[None, :, None] * t[:, None, None] + ph[None]), axis=1)
    return (sig + noise * rng.standard_normal((n, d)))[None, None]


def _check_error_vs_refinement(rng):
    """Fixed seed, attention with locality (smooth q, k, v plus noise): the RMS error against softmax
    attention falls as more of the 64 block pairs are refined (never up by more than 5 %), is below a
    quarter of the coarse-only error at half refinement, and vanishes when every pair is refined."""
    rng = np.random.default_rng(5)
    q, k, v = (_smooth_signal(rng, 64, 8, noise=0.3, amp=2.0) for _ in range(3))
    exact = softmax_attention_reference(q, k, v)
    errs = [float(np.sqrt(np.mean((mra_attention(q, k, v, num_blocks=m, block_size=8, eps=0.0) - exact) ** 2)))
            for m in (0, 8, 16, 32, 48, 64)]
    mono = all(b <= 1.05 * a for a, b in zip(errs, errs[1:]))
    assert mono and errs[3] < errs[0] / 4 and errs[-1] < 1e-12, f"MRA error vs refined blocks: {errs}"
    return errs[-1]


def _check_resolution_rate(rng):
    """Smooth q, k, v (low-frequency functions of the position), no refinement: the coarse approximation
    error is first order in the block width, err(b) ~ b (log-log slope in [0.8, 1.2] over b = 2..16)."""
    rng = np.random.default_rng(9)
    q, k, v = (_smooth_signal(rng, 256, 4) for _ in range(3))
    exact = softmax_attention_reference(q, k, v)
    bs = np.array([2, 4, 8, 16])
    errs = [np.sqrt(np.mean((mra_attention(q, k, v, num_blocks=0, block_size=int(bb), eps=0.0) - exact) ** 2))
            for bb in bs]
    slope = float(np.polyfit(np.log(bs), np.log(errs), 1)[0])
    assert 0.8 <= slope <= 1.2, f"coarse-resolution error slope {slope} (errors {errs}); expected about 1"
    return abs(slope - 1.0)


def _check_gradcheck_modes(rng):
    """Random-direction gradient checks for both modes with and without priors (eps = 1e-6 and 0)."""
    from ...testing import directional_check  # lazy: testing imports the registry

    err = 0.0
    for mode in MRA_MODES:
        for priors in (False, True):
            s = _draw(rng, "small", mode, priors)
            s.config["eps"] = 0.0 if priors else 1e-6
            err = max(err, directional_check(mra_attention_forward, mra_attention_backward, s).max_rel)
    return err


register(
    Mechanism(
        slug="mra_multiresolution_attention", family="4-linear-kernel-sparse", tier="T3",
        title="MRA-2: multiresolution approximation of self-attention",
        paper="Zeng, Pal, Kline, Fung, Singh, 'Multi Resolution Analysis (MRA) for Approximate Self-Attention', "
              "ICML 2022, arXiv 2207.10284",
        forward=mra_attention_forward, backward=mra_attention_backward, sample=_sample, reference=_reference,
        checks={"refined_set_vs_sort": _check_selection_brute_force,
                "all_refined_is_softmax_attention": _check_all_refined_is_softmax,
                "error_falls_with_refinement": _check_error_vs_refinement,
                "coarse_error_first_order_in_block_size": _check_resolution_rate,
                "directional_gradcheck_modes": _check_gradcheck_modes},
        docs="linear/low-rank-and-structured.md#mra-multiresolution-attention",
    ),
)
