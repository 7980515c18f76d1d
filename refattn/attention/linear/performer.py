r"""Performer FAVOR+: softmax-kernel attention estimated with positive (orthogonal) random features.

Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, arXiv 2009.14794. Follows
google-research ``performer/fast_attention/jax/fast_attention.py``
(``FastAttentionviaLowRankDecomposition``, ``nonnegative_softmax_kernel_feature_creator``,
``GaussianOrthogonalRandomMatrix``).

$$O = \Phi_Q(\Phi_K^\top V)\oslash\Phi_Q(\Phi_K^\top\mathbf 1)\quad(\text{prefix sums when causal}),$$
$$\phi(x)_l = m^{-1/2}\big(\exp(a\,w_l^\top x - \tfrac{a^2}{2}\|x\|^2 - s) + \varepsilon\big),
\qquad a = d^{-1/4}\ (\texttt{normalize\_data}),$$

so that $\mathbb E_w[\phi(q)\cdot\phi(k)] \propto \exp(q\cdot k/\sqrt d)$ (for $\varepsilon = 0$) and
$O$ estimates $\mathrm{softmax}(QK^\top/\sqrt d)V$. The projection $W\in\mathbb R^{m\times d}$
(`performer_projection_matrix`) is a config, not differentiated; $s$ is a max stabiliser.

Backward
--------
The feature-space linear-attention core of `refattn.attention.linear.core` (quotient rule; scans
when causal), then the positive-feature VJP (`performer_features_backward`): with
$e_l = m^{-1/2}\exp(h_l - s)$, $h_l = a\,w_l^\top x - \tfrac{a^2}{2}\|x\|^2$ and
$\gamma = \partial L/\partial\phi\odot e$,

$$dx = a\,\gamma W - a^2\,x\textstyle\sum_l\gamma_l - a\,\Big(\sum_{\text{stab group}}\gamma\Big)\,
w_{l^*}\ \text{at the arg-max row},$$

the last term being the (sub)gradient of the max stabiliser (``stabilizer_grad``).

Conventions
-----------
``feature_eps`` (JAX ``numerical_stabilizer`` 1e-6; performer-pytorch 1e-4),
``denominator_guard`` (JAX ``R + 2 s [|R| <= s]``; performer-pytorch none), ``key_sum_eps``
(performer-pytorch causal: $\mathrm{den}_i = \phi(q_i)\cdot(\sum_{j\le i}\phi(k_j) + 10^{-6})$, the
eps added to every entry of the key prefix sum; JAX and the non-causal performer-pytorch: none), ``key_stabilizer``
(``"per_head"`` as JAX; ``"global"`` as older performer-pytorch), ``stabilizer_grad`` (JAX
differentiates through the max; performer-pytorch detaches it) and the sign-corrected (Haar) QR
blocks of `performer_projection_matrix` (a deliberate deviation from upstream; see its docstring).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, check_positive
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv, softmax_attention_reference
from .core import linear_core_backward, linear_core_forward, mT, validate_linear_qkv

__all__ = [
    "performer_projection_matrix",
    "performer_features_forward",
    "performer_features_backward",
    "validate_performer_config",
    "performer_forward",
    "performer_backward",
    "performer",
]

_KEY_STAB = ("per_head", "global")


def performer_projection_matrix(nb_features: int, dim: int, *, seed: int = 0, scaling: int = 0,
                                orthogonal: bool = True) -> np.ndarray:
    r"""Random projection $W\in\mathbb R^{m\times d}$ for FAVOR+ (deterministic given ``seed``).

    Mirrors google-research ``performer/fast_attention/jax/fast_attention.py``
    ``GaussianOrthogonalRandomMatrix``: stacked blocks, each the transpose of the Q factor of a
    $d\times d$ Gaussian matrix (rows orthonormal within a block, the last block truncated), rows
    then scaled by the norms of an independent Gaussian $m\times d$ matrix (``scaling=0``, so rows
    are marginally $\mathcal N(0, I_d)$-distributed in norm) or by $\sqrt d$ (``scaling=1``).
    ``orthogonal=False`` gives i.i.d. Gaussian rows (``GaussianUnstructuredRandomMatrix``). The
    upstream draws use JAX's PRNG, so values differ.

    Deviation: each Q factor is sign-corrected ($Q\,\mathrm{diag}(\mathrm{sign}\,R_{ii})$, the
    standard recipe for a Haar-random orthogonal matrix). Upstream takes the raw ``qr`` output;
    with LAPACK's Householder convention (``numpy.linalg.qr``) the raw factor is *not* uniformly
    distributed (e.g. the first column's first entry always has the sign opposite to the
    Gaussian's), and the FAVOR+ estimate then stays biased however many features are drawn —
    refattn's ``converges_to_softmax_attention`` check fails without the correction.
    """
    m = check_int(nb_features, "nb_features", minimum=1)
    d = check_int(dim, "dim", minimum=1)
    check_choice(scaling, "scaling", (0, 1))
    rng = np.random.default_rng(check_int(seed, "seed"))
    if not orthogonal:
        return rng.standard_normal((m, d))
    blocks = []
    for _ in range(-(-m // d)):
        qmat, rmat = np.linalg.qr(rng.standard_normal((d, d)))
        # sign-fix so the block is Haar-distributed (LAPACK's Householder QR makes R's diagonal
        # sign depend on the data, which biases the rows; see the docstring)
        blocks.append((qmat * np.where(np.diag(rmat) < 0, -1.0, 1.0)).T)
    w = np.vstack(blocks)[:m]
    mult = np.linalg.norm(rng.standard_normal((m, d)), axis=1) if scaling == 0 else np.full(m, np.sqrt(d))
    return mult[:, None] * w


def performer_features_forward(x: np.ndarray, projection: np.ndarray, *, is_query: bool,
                               feature_eps: float = 1e-6, normalize_data: bool = True,
                               key_stabilizer: str = "per_head"):
    r"""Positive softmax-kernel features (unvalidated; ``x (..., N, d)``, ``projection (m, d)``).

    $$\phi(x)_l = m^{-1/2}\big(\exp(a\,w_l^\top x - \tfrac{a^2}{2}\|x\|^2 - s) + \varepsilon\big),
    \qquad a = d^{-1/4}\ (\texttt{normalize\_data}),$$

    so that $\mathbb E_w[\phi(q)\cdot\phi(k)] \propto \exp(q\cdot k/\sqrt d)$ (for
    $\varepsilon = 0$). The stabiliser $s$ (google-research
    ``nonnegative_softmax_kernel_feature_creator``): queries, the max of $a\,w_l^\top x$ over the
    $m$ features of each row; keys, the max over all positions and features of each leading index
    (``"per_head"``: per (batch, head), as the JAX code) or over the whole tensor (``"global"``,
    older performer-pytorch ``torch.max(data_dash)``, which couples batch elements).
    Returns ``(phi, cache)``.
    """
    a = x.shape[-1] ** -0.25 if normalize_data else 1.0
    m = projection.shape[0]
    ratio = m ** -0.5
    dd = a * (x @ projection.T)
    diag = (0.5 * a * a) * np.sum(x * x, axis=-1, keepdims=True)
    if is_query:
        axes = (-1,)
    elif key_stabilizer == "per_head":
        axes = (-2, -1)
    else:
        axes = tuple(range(dd.ndim))
    stab = np.max(dd, axis=axes, keepdims=True)
    e = ratio * np.exp(dd - diag - stab)
    return e + ratio * feature_eps, {"x": x, "e": e, "dd": dd, "a": a, "axes": axes, "W": projection}


def performer_features_backward(dphi: np.ndarray, fcache: dict, *, stabilizer_grad: bool = True):
    r"""VJP of :func:`performer_features_forward`.

    With $e_l = m^{-1/2}\exp(h_l - s)$, $h_l = a\,w_l^\top x - \tfrac{a^2}{2}\|x\|^2$:
    $\partial e_l/\partial x = e_l\,(a\,w_l - a^2x) - e_l\,\partial s/\partial x$, so with
    $\gamma = \partial L/\partial\phi\odot e$:

    $$dx = a\,\gamma W - a^2\,x\textstyle\sum_l\gamma_l - a\,\Big(\sum_{\text{stab group}}\gamma\Big)\,
    w_{l^*}\ \text{at the arg-max row}.$$

    The last term is the (sub)gradient of the max stabiliser, which lands on the arg-max entry
    $(n^*, l^*)$ of its group ($\partial s/\partial x_{n^*} = a\,w_{l^*}$). ``stabilizer_grad``:
    True differentiates through the max like the JAX code (no ``stop_gradient`` there); False
    treats $s$ as a constant (performer-pytorch ``.detach()``). The two agree exactly when
    ``feature_eps = 0`` and no denominator guard fires, because $s$ then cancels in the attention
    ratio.
    """
    x, e, a, W, axes = fcache["x"], fcache["e"], fcache["a"], fcache["W"], fcache["axes"]
    ge = dphi * e
    dx = a * (ge @ W) - (a * a) * x * np.sum(ge, axis=-1, keepdims=True)
    if stabilizer_grad:
        dd = fcache["dd"]
        lead = dd.shape[: dd.ndim - len(axes)]
        flat = dd.reshape(lead + (-1,))
        onehot = np.zeros_like(flat)
        np.put_along_axis(onehot, np.argmax(flat, axis=-1)[..., None], 1.0, axis=-1)
        onehot = onehot.reshape(dd.shape)
        tot = np.sum(ge, axis=axes, keepdims=True)
        dx = dx - a * ((onehot * tot) @ W)
    return dx


def validate_performer_config(projection, d, dtype, feature_eps, denominator_guard, key_stabilizer, causal,
                              normalize_data, stabilizer_grad):
    """Validate the Performer keywords (shared with `refattn.attention.linear.rpe_fft`): ``projection``
    must be ``(nb_features, d)``, the epsilons non-negative, the flags bools. Returns
    ``(projection cast to dtype, feature_eps, denominator_guard)``."""
    projection = as_float(projection, "projection", ndim=2)
    if projection.shape[1] != d:
        raise ValueError(f"projection must have shape (nb_features, d={d}); got {projection.shape}")
    feature_eps = check_positive(feature_eps, "feature_eps", allow_zero=True)
    denominator_guard = check_positive(denominator_guard, "denominator_guard", allow_zero=True)
    check_choice(key_stabilizer, "key_stabilizer", _KEY_STAB)
    for name, val in (("causal", causal), ("normalize_data", normalize_data),
                      ("stabilizer_grad", stabilizer_grad)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(val).__name__}")
    return projection.astype(dtype, copy=False), feature_eps, denominator_guard


def performer_forward(q, k, v, *, projection, causal: bool = False, feature_eps: float = 1e-6,
                      denominator_guard: float = 1e-6, key_sum_eps: float = 0.0, normalize_data: bool = True,
                      key_stabilizer: str = "per_head", stabilizer_grad: bool = True):
    r"""Performer FAVOR+ softmax-kernel attention (Choromanski et al., ICLR 2021, arXiv 2009.14794).

    $O = \Phi_Q(\Phi_K^\top V)\oslash\Phi_Q(\Phi_K^\top\mathbf 1)$ (prefix sums when causal) with
    the positive random features of :func:`performer_features_forward`; it estimates
    $\mathrm{softmax}(QK^\top/\sqrt d)V$. Follows google-research
    ``performer/fast_attention/jax/fast_attention.py`` (``FastAttentionviaLowRankDecomposition``).

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    projection : (m, d) array, config
        The random features $W$ (not differentiated; draw it once, e.g. with
        :func:`performer_projection_matrix`; upstream redraws are a training-time choice).
    causal : bool
        Prefix sums (``unidirectional``).
    feature_eps : float
        Added inside each feature (JAX ``numerical_stabilizer`` = 1e-6 via
        ``make_fast_softmax_attention``; the creator's own default and performer-pytorch use 1e-4).
    denominator_guard : float
        JAX: ``R + 2*s*(|R| <= s)`` with ``s = numerical_stabilizer`` (1e-6); performer-pytorch:
        none (0). Piecewise constant, so it has no gradient.
    key_sum_eps : float
        $\delta$ added to every entry of the key sum in the denominator,
        $\mathrm{den}_i = \phi(q_i)\cdot(\sum_j\phi(k_j) + \delta\mathbf 1)$ (prefix sums when causal).
        lucidrains/performer-pytorch ``performer_pytorch/performer_pytorch.py``
        (``causal_linear_attention_noncuda`` and ``causal_linear_attention``, ``eps=1e-6``) uses
        $\delta = 10^{-6}$ when causal and none otherwise (``linear_attention``); JAX: 0 (default).
        To reproduce performer-pytorch's ``FastAttention``: ``feature_eps=1e-4,
        denominator_guard=0, key_sum_eps=1e-6 if causal else 0, stabilizer_grad=False``
        (``key_stabilizer="per_head"``, its ``amax`` over ``dim=(-1, -2)``).
    normalize_data : bool
        Pre-scale by $d^{-1/4}$ (the $1/\sqrt d$ softmax temperature).
    key_stabilizer : {"per_head", "global"}
        See :func:`performer_features_forward`.
    stabilizer_grad : bool
        Differentiate through the max stabilisers (JAX, default) or stop-gradient
        (performer-pytorch ``detach``); see :func:`performer_features_backward`.

    Notes
    -----
    Backward: the feature-space linear-attention core (quotient rule; scans when causal), then
    :func:`performer_features_backward` for $Q$ and $K$.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    projection, feature_eps, guard = validate_performer_config(
        projection, q.shape[-1], q.dtype, feature_eps, denominator_guard, key_stabilizer, causal,
        normalize_data, stabilizer_grad)
    key_sum_eps = check_positive(key_sum_eps, "key_sum_eps", allow_zero=True)
    fq, cq = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    fk, ck = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    out, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=True, den_guard=guard,
                                     key_sum_eps=key_sum_eps)
    return out, {"fq": fq, "fk": fk, "cq": cq, "ck": ck, "v": v, "out": out, "state": state,
                 "causal": bool(causal), "stabilizer_grad": bool(stabilizer_grad)}


def performer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`performer_forward`: core VJP, then the positive
    feature VJP $\partial\phi_l/\partial x = e_l(a w_l - a^2 x)$ minus the stabiliser term."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = linear_core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                  causal=cache["causal"], normalise=True)
    sg = cache["stabilizer_grad"]
    return {"q": performer_features_backward(dfq, cache["cq"], stabilizer_grad=sg),
            "k": performer_features_backward(dfk, cache["ck"], stabilizer_grad=sg), "v": dv}


def performer(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`performer_forward`."""
    return performer_forward(q, k, v, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _performer_reference(q, k, v, *, projection, causal=False, feature_eps=1e-6, denominator_guard=1e-6,
                         key_sum_eps=0.0, normalize_data=True, key_stabilizer="per_head", stabilizer_grad=True):
    q, k, v = validate_linear_qkv(q, k, v, same_length=causal)
    fq, _ = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    fk, _ = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    A = fq @ mT(fk)
    if causal:
        A = np.tril(A)
    den = A.sum(-1, keepdims=True) + key_sum_eps * fq.sum(-1, keepdims=True)
    den = den + 2 * denominator_guard * (np.abs(den) <= denominator_guard)
    return (A @ v) / den


def _sample_performer(rng, size):
    q, k, v = random_qkv(rng, size, same_length=True)
    m = 6 if size == "tiny" else 16
    proj = performer_projection_matrix(m, q.shape[-1], seed=int(rng.integers(0, 2**31)))
    return Sample(inputs={"q": q * 0.7, "k": k * 0.7, "v": v},
                  config={"projection": proj, "causal": bool(rng.integers(0, 2)),
                          "key_sum_eps": float(rng.choice([0.0, 0.2]))})



def _check_performer_converges(rng):
    """Fixed-seed statistical bound: the FAVOR+ estimate approaches softmax attention as the number
    of features grows (error at m = 16384 below 0.03 and below a fifth of the error at m = 16).
    Inputs and projections use their own fixed seeds, so the bound is deterministic."""
    rng = np.random.default_rng(2024)
    q = rng.standard_normal((2, 2, 8, 4)) * 0.5
    k = rng.standard_normal((2, 2, 8, 4)) * 0.5
    v = rng.standard_normal((2, 2, 8, 3))
    exact = softmax_attention_reference(q, k, v)
    errs = {}
    for m in (16, 16384):
        proj = performer_projection_matrix(m, 4, seed=1234)
        errs[m] = float(np.max(np.abs(performer(q, k, v, projection=proj, feature_eps=0.0) - exact)))
    assert errs[16384] < 0.03 and errs[16384] < errs[16] / 5, f"no convergence to softmax attention: {errs}"
    return errs[16384]


def _check_performer_unbiased(rng):
    """Monte-Carlo unbiasedness (fixed seeds): with i.i.d. Gaussian rows and feature_eps = 0,
    phi(q).phi(k) times exp(s_q + s_k) (undoing the stabilisers) estimates exp(q.k/sqrt d); the
    estimate must lie within 4 standard errors of the exact kernel, the standard error below 2%."""
    rng = np.random.default_rng(7)
    d, m = 4, 200_000
    q = 0.6 * rng.standard_normal((1, 1, d))
    k = 0.6 * rng.standard_normal((1, 1, d))
    w = performer_projection_matrix(m, d, seed=99, orthogonal=False)
    fq, cq = performer_features_forward(q, w, is_query=True, feature_eps=0.0)
    fk, ck = performer_features_forward(k, w, is_query=False, feature_eps=0.0)
    terms = m * fq[0, 0] * fk[0, 0] * np.exp(cq["dd"].max() + ck["dd"].max())
    est, se = terms.mean(), terms.std() / np.sqrt(m)
    exact = float(np.exp(np.sum(q * k) / np.sqrt(d)))
    assert se < 0.02 * exact and abs(est - exact) < 4 * se, (est, exact, se)
    return abs(est - exact) / exact


def _check_performer_stabilizers_cancel(rng):
    """feature_eps = 0, no guard: outputs invariant to the stabiliser choice, and the stop-gradient
    backward equals the full one (the max shifts cancel in the ratio)."""
    q, k, v = random_qkv(rng, "small")
    proj = performer_projection_matrix(8, q.shape[-1], seed=5)
    kw = {"projection": proj, "feature_eps": 0.0, "denominator_guard": 0.0}
    o1, c1 = performer_forward(q, k, v, key_stabilizer="per_head", **kw)
    o2, _ = performer_forward(q, k, v, key_stabilizer="global", **kw)
    _, c3 = performer_forward(q, k, v, key_stabilizer="per_head", stabilizer_grad=False, **kw)
    g = rng.standard_normal(o1.shape)
    g1, g3 = performer_backward(g, c1), performer_backward(g, c3)
    err = max(float(np.max(np.abs(o1 - o2))), *(float(np.max(np.abs(g1[n] - g3[n]))) for n in g1))
    assert err < 1e-10, f"stabilisers do not cancel: {err}"
    return err


def _check_performer_fd_variants(rng):
    errs = []
    for causal, stab, kse in ((False, "global", 0.0), (True, "per_head", 0.2), (False, "per_head", 0.2)):
        q, k, v = random_qkv(rng, "tiny")
        proj = performer_projection_matrix(5, q.shape[-1], seed=3)
        s = Sample(inputs={"q": q, "k": k, "v": v},
                   config={"projection": proj, "causal": causal, "key_stabilizer": stab, "feature_eps": 1e-3,
                           "key_sum_eps": kse})
        errs.append(fd_max_rel(performer_forward, performer_backward, s))
    return max(errs)


def _check_projection_orthogonal(rng):
    w = performer_projection_matrix(10, 4, seed=int(rng.integers(0, 1000)))
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    err = 0.0
    for start in range(0, 10, 4):
        blk = u[start:start + 4]
        err = max(err, float(np.max(np.abs(blk @ blk.T - np.eye(len(blk))))))
    assert err < 1e-12, f"blocks are not orthogonal: {err}"
    return err


register(
    Mechanism(
        slug="performer_favor_plus", family="4-linear-kernel-sparse", tier="T1",
        title="Performer FAVOR+ (positive orthogonal random features, fixed projection)",
        paper="Choromanski et al., 'Rethinking Attention with Performers', ICLR 2021, arXiv 2009.14794",
        forward=performer_forward, backward=performer_backward, sample=_sample_performer,
        reference=_performer_reference,
        checks={"converges_to_softmax_attention": _check_performer_converges,
                "kernel_estimate_unbiased": _check_performer_unbiased,
                "stabilizers_cancel_without_eps": _check_performer_stabilizers_cancel,
                "gradcheck_variants": _check_performer_fd_variants,
                "projection_blocks_orthogonal": _check_projection_orthogonal},
        docs="linear-attention.md#performer-favor",
    ),
)
