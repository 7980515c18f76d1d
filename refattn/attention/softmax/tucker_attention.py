r"""Tucker Attention: multi-head attention whose stacked weight tensors are Tucker-factorised.

The weight objects
------------------
Multi-head attention with per-head $W^Q_i, W^K_i, W^V_i\in\mathbb R^{d\times d_H}$ and
$W^O_i\in\mathbb R^{d_H\times d}$ only ever uses the products $W_i = W^Q_iW^{K\top}_i$ (before the
softmax) and $\tilde W_i = (W^V_iW^O_i)^\top$ (after it). Stacked over the heads they are two
third-order tensors $\mathcal W, \tilde{\mathcal W}\in\mathbb R^{n_H\times d\times d}$ (modes: head,
query, key; head, output, value), and MHA reads

$$\mathrm{MHA}(X)_{jk} = \sum_{i,\ell}\mathcal H^{(1)}_{ij\ell}\,\mathcal H^{(2)}_{ik\ell},\qquad
\mathcal H^{(1)} = \sigma\Big(\tfrac{\mathcal W\times_2X\times_3X}{\sqrt{d_H}}\Big),\qquad
\mathcal H^{(2)} = \tilde{\mathcal W}\times_3X,$$

$\sigma$ the row softmax. Tucker Attention parameterises both tensors by Tucker factorisations,

$$\mathcal W = \mathcal C\times_1U_1\times_2U_2\times_3U_3,\qquad
\tilde{\mathcal W} = \tilde{\mathcal C}\times_1\tilde U_1\times_2\tilde U_2\times_3\tilde U_3,$$

cores $\mathcal C\in\mathbb R^{r_1\times r_2\times r_3}$, $\tilde{\mathcal C}\in\mathbb R^{\tilde r_1\times\tilde r_2\times\tilde r_3}$,
factors $U_1\in\mathbb R^{n_H\times r_1}$ (head mode), $U_2\in\mathbb R^{d\times r_2}$ (query / output),
$U_3\in\mathbb R^{d\times r_3}$ (key / value). MHA, MQA, GQA and MLA are the special cases with head rank
$n_H$ (MHA: ranks $(n_H, d, d)$; GQA: $(n_H, d, n_{KV}d_H)$; MLA: $(n_H, d^Q_c, d^K_c)$).

Forward (the factored computation, never forming $\mathcal W$)
---------------------------------------------------------------
With the per-head cores $B_i = \sum_aU_1[i,a]\,\mathcal C_a\in\mathbb R^{r_2\times r_3}$ and
$\tilde B_i = \sum_a\tilde U_1[i,a]\,\tilde{\mathcal C}_a\in\mathbb R^{\tilde r_2\times\tilde r_3}$:

$$P = XU_2,\quad K = XU_3,\quad V = X\tilde U_3,\quad \hat Q_i = PB_i,\quad
A_i = \sigma\big(s\,\hat Q_iK^\top\big),\quad O_i = A_iV,\quad Y = \Big(\sum_iO_i\tilde B_i^\top\Big)\tilde U_2^\top,$$

$s = 1/\sqrt{d_H}$, $d_H = d/n_H$. Every head shares the one latent key $K$ (width $r_3$) and value
$V$ (width $\tilde r_3$): multi-query attention in the latent space (the paper's flash-attention
call with $n_{KV} = 1$). Latent RoPE rotates $\hat Q_i$ and $K$ along the latent key axis $r_3$
(values are not rotated), so scores depend on positions only through their difference.

Backward
--------
With $dZ = dY\tilde U_2$ ($Z = \sum_iO_i\tilde B_i^\top$): $d\tilde U_2 = dY^\top Z$,
$dO_i = dZ\,\tilde B_i$, $d\tilde B_i = dZ^\top O_i$, then the attention VJP
(`attention_core_backward`, $dP = dO\,V^\top$, $dS = A\odot(dP-\mathrm{rowsum}(dP\odot A))$,
$d\hat Q = s\,dS\,K$, $dK = s\,\sum_i dS_i^\top\hat Q_i$, $dV = \sum_iA_i^\top dO_i$; the sums over
heads are the MQA reduction), RoPE's transpose $R(-\phi)$, and

$$dB_i = P^\top d\hat Q_i,\qquad dP = \sum_i d\hat Q_i B_i^\top,\qquad
d\mathcal C_a = \sum_iU_1[i,a]\,dB_i,\qquad dU_1[i,a] = \langle dB_i, \mathcal C_a\rangle$$

(the same for the tilde core and $\tilde U_1$ with $d\tilde B_i$), $dU_2 = X^\top dP$, $dU_3 = X^\top dK$,
$d\tilde U_3 = X^\top dV$, $dX = dP\,U_2^\top + dK\,U_3^\top + dV\,\tilde U_3^\top$ (sums over the batch
for the weights). With ``shared_kv`` ($\tilde U_3 = U_3$) the two $U_3$ gradients add.

Conventions (keyword, default)
------------------------------
``scale`` $1/\sqrt{d_H}$ with $d_H = d/n_H$ (the paper's $\mathcal H^{(1)}$; pass ``scale`` for
another, e.g. $1/\sqrt{r_3}$, the default of a flash kernel called on the latent keys).
``is_causal`` False (ViT; True for the LLM runs). ``rope_base`` None (no RoPE; the LLM runs use
latent RoPE), non-interleaved pairs (``rope_interleaved``). ``shared_kv`` False. Parameter names
are the paper's symbols (``core``, ``U1``, ``U2``, ``U3`` and ``core_tilde``, ``U1_tilde``,
``U2_tilde``, ``U3_tilde``); the factors are stored as in the paper, $U_2, U_3, \tilde U_2, \tilde U_3$
of shape $(d, r)$, so $XU_2$ is ``x @ U2``.

Paper: T. Klein, J. Kusch, S. Sager, S. Schnake, S. Schotthöfer, "Tucker Attention: A generalization
of approximate attention mechanisms", ICML 2026, arXiv 2603.30033. The official code
(ScSteffen/Tucker-Attention, a Triton kernel ``src/attn/triton/tucker_attn.py`` that takes the latent
$Q_i$, $K$, $V$ and the per-head cores ``B_pre`` $(n_H, r_q, r_k)$) could not be retrieved: it is
neither in the code index nor fetchable here, so the definitions above are the paper's (Sec. 2-3: the tensor form, the definition
of Tucker Attention, the KV-cache and latent-RoPE formulas, Theorems B.2-B.4), read from the
beginning of its arXiv HTML version, a detailed public summary of Sections 2-5 and a public
reproduction script of Theorem B.4 (which uses the same $1/\sqrt{d_H}$ and factor layout).
**Reconstruction:** the channel pairing of latent RoPE (the paper writes $R(\ell, r_3)$ without
fixing it; rotate-half is the default, ``rope_interleaved=True`` the other), no biases, and the
initialiser.

Measured agreement (float64, CPU, torch 2.13): no upstream code could be run, so the paper's
tensor form was transcribed into torch ($\mathcal W$, $\tilde{\mathcal W}$ rebuilt from the factors
with ``einsum``, $\mathcal H^{(1)}$, $\mathcal H^{(2)}$ and their contraction; latent RoPE as the
explicit $\hat Q_m\times_3(K_nR(n)R(m)^\top)$ with rotation matrices) and differentiated with
autograd, over four shapes (bidirectional and causal, with and without latent RoPE, ``shared_kv``,
ranks below and at $d$): output max abs error 1.6e-15, gradients of $x$ and every factor and core
max abs error 1.1e-14.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ...nn.rope import apply_rope, rope_angles
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward

__all__ = ["TUCKER_PRE", "TUCKER_POST", "tucker_head_cores", "tucker_weight_tensors", "tucker_attention_forward",
           "tucker_attention_backward", "tucker_attention", "init_tucker_attention_params"]

TUCKER_PRE = ("core", "U1", "U2", "U3")
TUCKER_POST = ("core_tilde", "U1_tilde", "U2_tilde", "U3_tilde")


def tucker_head_cores(core: np.ndarray, u1: np.ndarray) -> np.ndarray:
    r"""$B_i = \sum_a U_1[i, a]\,\mathcal C_a$: the per-head ``(n_H, r_2, r_3)`` cores (unvalidated)."""
    return np.einsum("ia,abc->ibc", u1, core)


def tucker_weight_tensors(params) -> tuple[np.ndarray, np.ndarray]:
    r"""The full tensors $\mathcal W = \mathcal C\times_1U_1\times_2U_2\times_3U_3$ and $\tilde{\mathcal W}$,
    each ``(n_H, d, d)`` (unvalidated; for analysis and the explicit reference). With ``shared_kv``
    leave ``U3_tilde`` out of ``params``: it is ``U3``."""
    u3t = params.get("U3_tilde", params["U3"])
    w = np.einsum("ia,abc,jb,kc->ijk", params["U1"], params["core"], params["U2"], params["U3"])
    wt = np.einsum("ia,abc,jb,kc->ijk", params["U1_tilde"], params["core_tilde"], params["U2_tilde"], u3t)
    return w, wt


def _validate(x, params, shared_kv):
    x = as_float(x, "x", ndim=3)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with {list(TUCKER_PRE + TUCKER_POST)}; got {type(params).__name__}")
    if not isinstance(shared_kv, (bool, np.bool_)):
        raise TypeError(f"shared_kv must be a bool; got {type(shared_kv).__name__}")
    shapes = {k: np.shape(params[k]) for k in ("core", "core_tilde") if k in params}
    if len(shapes) < 2 or any(len(s) != 3 for s in shapes.values()):
        raise ValueError(f"params needs 'core' (r1, r2, r3) and 'core_tilde' (r1~, r2~, r3~), 3-D; got shapes {shapes}")
    r1, r2, r3 = shapes["core"]
    t1, t2, t3 = shapes["core_tilde"]
    u1 = np.shape(params.get("U1"))
    if len(u1) != 2:
        raise ValueError(f"U1 must have shape (n_H, r1 = {r1}); got {u1}")
    h, d = u1[0], x.shape[-1]
    spec = {"core": (r1, r2, r3), "U1": (h, r1), "U2": (d, r2), "U3": (d, r3),
            "core_tilde": (t1, t2, t3), "U1_tilde": (h, t1), "U2_tilde": (d, t2)}
    if shared_kv:
        if t3 != r3:
            raise ValueError(f"shared_kv needs the same key and value rank; got r3 = {r3}, r3~ = {t3}")
    else:
        spec["U3_tilde"] = (d, t3)
    p = check_params(params, spec, where="tucker_attention (factors (d, r) as in the paper)")
    return x, p, h, d


def tucker_attention_forward(x, params, *, is_causal: bool = False, scale=None, rope_base=None,
                             rope_interleaved: bool = False, rope_offset: int = 0, shared_kv: bool = False):
    r"""Tucker Attention on ``x (B, N, d)`` (module docstring for the math).

    Parameters
    ----------
    x : array (B, N, d)
    params : dict
        ``core`` (r1, r2, r3), ``U1`` (n_H, r1), ``U2`` (d, r2), ``U3`` (d, r3), ``core_tilde``
        (r1~, r2~, r3~), ``U1_tilde`` (n_H, r1~), ``U2_tilde`` (d, r2~), ``U3_tilde`` (d, r3~)
        (absent with ``shared_kv``).
    is_causal : bool
    scale : float > 0, optional
        Default $1/\sqrt{d/n_H}$.
    rope_base : float, optional
        Latent RoPE on $\hat Q_i$ and $K$ along $r_3$ (even), positions ``0..N-1``; None: none.
    rope_interleaved : bool
    rope_offset : int
        Added to the positions (decoding after ``rope_offset`` cached tokens).
    shared_kv : bool
        $\tilde U_3 = U_3$ (one latent cache for keys and values).

    Returns
    -------
    out, cache
        ``out (B, N, d)``.
    """
    x, p, h, d = _validate(x, params, shared_kv)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    scale = (h / d) ** 0.5 if scale is None else check_positive(scale, "scale")
    r3 = p["core"].shape[2]
    if rope_base is not None:
        rope_base = check_positive(rope_base, "rope_base")
        if r3 % 2:
            raise ValueError(f"latent RoPE rotates the key rank r3, which must be even; got r3 = {r3}")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    u3t = p["U3"] if shared_kv else p["U3_tilde"]
    n = x.shape[1]
    b_pre = tucker_head_cores(p["core"], p["U1"])
    b_post = tucker_head_cores(p["core_tilde"], p["U1_tilde"])
    pq = x @ p["U2"]
    qh = np.einsum("bnr,irs->bins", pq, b_pre)
    k = (x @ p["U3"])[:, None]
    v = (x @ u3t)[:, None]
    cos = sin = None
    if rope_base is not None:
        ang = rope_angles(np.arange(n) + check_int(rope_offset, "rope_offset"), r3, base=rope_base)
        cos, sin = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
        qh, k = apply_rope(qh, cos, sin, bool(rope_interleaved)), apply_rope(k, cos, sin, bool(rope_interleaved))
    o, ca = attention_core_forward(qh, k, v, is_causal=bool(is_causal), scale=float(scale))
    z = np.einsum("bins,its->bnt", o, b_post)
    out = z @ p["U2_tilde"].T
    cache = {"x": x, "p": p, "shared_kv": bool(shared_kv), "b_pre": b_pre, "b_post": b_post, "pq": pq, "o": o,
             "z": z, "ca": ca, "cos": cos, "sin": sin, "inter": bool(rope_interleaved), "shape": out.shape, "dtype": dt}
    return out, cache


def tucker_attention_backward(dout, cache):
    r"""Gradient of :func:`tucker_attention_forward` for ``x`` and every factor and core."""
    dt = cache["dtype"]
    dy = as_dout(dout, cache["shape"], dt)
    x, p = cache["x"], cache["p"]
    g = {"U2_tilde": np.einsum("bnk,bnt->kt", dy, cache["z"])}
    dz = dy @ p["U2_tilde"]
    do = np.einsum("bnt,its->bins", dz, cache["b_post"])
    db_post = np.einsum("bnt,bins->its", dz, cache["o"])
    ga = attention_core_backward(do, cache["ca"])
    dq, dk, dv = ga["q"], ga["k"], ga["v"]
    if cache["cos"] is not None:
        dq = apply_rope(dq, cache["cos"], -cache["sin"], cache["inter"])
        dk = apply_rope(dk, cache["cos"], -cache["sin"], cache["inter"])
    dk, dv = dk[:, 0], dv[:, 0]
    db_pre = np.einsum("bnr,bins->irs", cache["pq"], dq)
    dpq = np.einsum("bins,irs->bnr", dq, cache["b_pre"])
    for core, u1, db in (("core", "U1", db_pre), ("core_tilde", "U1_tilde", db_post)):
        g[core] = np.einsum("ia,irs->ars", p[u1], db)
        g[u1] = np.einsum("irs,ars->ia", db, p[core])
    g["U2"] = np.einsum("bnd,bnr->dr", x, dpq)
    g["U3"] = np.einsum("bnd,bnr->dr", x, dk)
    gv = np.einsum("bnd,bnr->dr", x, dv)
    u3t = p["U3"] if cache["shared_kv"] else p["U3_tilde"]
    if cache["shared_kv"]:
        g["U3"] = g["U3"] + gv
    else:
        g["U3_tilde"] = gv
    dx = dpq @ p["U2"].T + dk @ p["U3"].T + dv @ u3t.T
    return {"x": dx, **g}


def tucker_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`tucker_attention_forward`."""
    return tucker_attention_forward(x, params, **config)[0]


def init_tucker_attention_params(rng, d: int, num_heads: int, ranks=(4, 32, 32), ranks_tilde=None, *,
                                 shared_kv: bool = False) -> dict:
    r"""Random factors and cores: $U$'s orthonormal columns (QR of a Gaussian), cores
    $\mathcal N(0, 1/(r_2 r_3))$-scaled so $\hat Q$ and $Y$ start at unit scale (**reconstruction**:
    the paper's initialisation is not used here)."""
    r1, r2, r3 = (int(r) for r in ranks)
    t1, t2, t3 = (r1, r2, r3) if ranks_tilde is None else (int(r) for r in ranks_tilde)

    def orth(m, r):
        qm = np.linalg.qr(rng.standard_normal((m, max(m, r))))[0]
        return qm[:, :r] if r <= m else rng.standard_normal((m, r)) / np.sqrt(m)

    out = {"core": rng.standard_normal((r1, r2, r3)) / np.sqrt(r2), "U1": orth(num_heads, r1), "U2": orth(d, r2),
           "U3": orth(d, r3), "core_tilde": rng.standard_normal((t1, t2, t3)) / np.sqrt(t3),
           "U1_tilde": orth(num_heads, t1), "U2_tilde": orth(d, t2)}
    if not shared_kv:
        out["U3_tilde"] = orth(d, t3)
    return out


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    d, h, ranks, rt, n = (4, 3, (2, 3, 2), (2, 2, 3), 3) if size == "tiny" else (6, 4, (3, 4, 4), (2, 5, 3), 6)
    x = rng.standard_normal((2, n, d))
    p = {k: v * (1.0 + 0.3 * rng.standard_normal(v.shape)) for k, v in init_tucker_attention_params(rng, d, h, ranks, rt).items()}
    cfg = {"is_causal": size == "small", "rope_base": 10.0}
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _reference(x, params=None, *, is_causal=False, scale=None, rope_base=None, rope_interleaved=False, rope_offset=0,
               shared_kv=False):
    # the paper's tensor form: rebuild W and W~ from the factors, H1 = softmax(W x2 X x3 X * s), H2 = W~ x3 X
    w, wt = tucker_weight_tensors(params)
    h, d = w.shape[0], x.shape[-1]
    s = (h / d) ** 0.5 if scale is None else scale
    n = x.shape[1]
    out = np.zeros(x.shape)
    for b in range(x.shape[0]):
        xb = x[b]
        if rope_base is None:
            sc = s * np.einsum("ijk,mj,nk->imn", w, xb, xb)
        else:  # latent RoPE: rotate the latent query/key rows, W_i = U2 B_i U3^T
            bcore = tucker_head_cores(params["core"], params["U1"])
            r3 = bcore.shape[-1]
            ang = rope_angles(np.arange(n) + rope_offset, r3, base=rope_base)
            qh = apply_rope(np.einsum("nr,irs->ins", xb @ params["U2"], bcore), np.cos(ang), np.sin(ang), rope_interleaved)
            kk = apply_rope(xb @ params["U3"], np.cos(ang), np.sin(ang), rope_interleaved)
            sc = s * np.einsum("ins,ms->inm", qh, kk)
        if is_causal:
            sc = np.where(np.tri(n, dtype=bool), sc, -np.inf)
        a = np.exp(sc - sc.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        h2 = np.einsum("ikl,nl->ikn", wt, xb)
        out[b] = np.einsum("ijn,ikn->jk", a, h2)
    return out


def _mha_as_tucker(rng, d=6, h=3, n=5):
    dh = d // h
    wq, wk, wv = (rng.standard_normal((h, d, dh)) for _ in range(3))
    wo = rng.standard_normal((h, dh, d))
    x = rng.standard_normal((2, n, d))
    ref = np.zeros_like(x)
    for i in range(h):
        sc = (x @ wq[i]) @ np.swapaxes(x @ wk[i], 1, 2) / np.sqrt(dh)
        a = np.exp(sc - sc.max(-1, keepdims=True))
        ref += (a / a.sum(-1, keepdims=True)) @ (x @ wv[i]) @ wo[i]
    return x, wq, wk, wv, wo, ref


def _check_mha_special_case(rng):
    # ranks (n_H, d, d), U1 = U2 = U3 = I, C_i = W^Q_i W^K_i^T, C~_i = (W^V_i W^O_i)^T: exactly MHA
    x, wq, wk, wv, wo, ref = _mha_as_tucker(rng)
    h, d = wq.shape[:2]
    eye = np.eye(d)
    p = {"core": wq @ np.swapaxes(wk, 1, 2), "U1": np.eye(h), "U2": eye, "U3": eye,
         "core_tilde": np.swapaxes(wv @ wo, 1, 2), "U1_tilde": np.eye(h), "U2_tilde": eye, "U3_tilde": eye}
    err = float(np.abs(tucker_attention(x, p) - ref).max())
    assert err < 1e-12, err
    return err


def _check_mqa_special_case(rng):
    # one shared key/value head: U3 = W^K, U3~ = W^V, U2 = U2~ = I, C_i = W^Q_i, C~_i = W^O_i^T (key rank d_H)
    x, wq, wk, wv, wo, _ = _mha_as_tucker(rng)
    h, d, dh = wq.shape
    ref = np.zeros_like(x)
    for i in range(h):
        sc = (x @ wq[i]) @ np.swapaxes(x @ wk[0], 1, 2) / np.sqrt(dh)
        a = np.exp(sc - sc.max(-1, keepdims=True))
        ref += (a / a.sum(-1, keepdims=True)) @ (x @ wv[0]) @ wo[i]
    p = {"core": wq, "U1": np.eye(h), "U2": np.eye(d), "U3": wk[0], "core_tilde": np.swapaxes(wo, 1, 2),
         "U1_tilde": np.eye(h), "U2_tilde": np.eye(d), "U3_tilde": wv[0]}
    err = float(np.abs(tucker_attention(x, p) - ref).max())
    assert err < 1e-12, err
    return err


def _check_latent_rope_relative(rng):
    # latent RoPE scores depend on positions only through their difference: shifting every position
    # by the same offset leaves the output unchanged, while the rotation itself does change it
    s = _sample(rng, "small")
    x, p = s.inputs["x"], s.params
    y = tucker_attention(x, p, is_causal=True, rope_base=10.0)
    err = float(np.abs(y - tucker_attention(x, p, is_causal=True, rope_base=10.0, rope_offset=7)).max())
    assert err < 1e-12, err
    assert np.abs(y - tucker_attention(x, p, is_causal=True)).max() > 1e-3
    return err


def _check_shared_kv_gradient(rng):
    # shared_kv: U3 serves keys and values; its gradient is the sum of the two roles
    s = _sample(rng, "tiny")
    p = {k: v for k, v in s.params.items() if k != "U3_tilde"}
    p["core_tilde"] = p["core_tilde"][:, :, :2]
    dy = rng.standard_normal(s.inputs["x"].shape)
    g = tucker_attention_backward(dy, tucker_attention_forward(s.inputs["x"], p, shared_kv=True)[1])
    ps = dict(p, U3_tilde=p["U3"])
    gs = tucker_attention_backward(dy, tucker_attention_forward(s.inputs["x"], ps)[1])
    err = float(np.abs(g["U3"] - gs["U3"] - gs["U3_tilde"]).max())
    assert err < 1e-12 and "U3_tilde" not in g, err
    return err


register(
    Mechanism(
        slug="tucker_attention", family="1-softmax", tier="T3",
        title="Tucker Attention: Tucker-factorised pre- and post-softmax weight tensors (MHA, GQA, MLA as special cases)",
        paper="T. Klein, J. Kusch, S. Sager, S. Schnake, S. Schotthöfer, Tucker Attention: A generalization of "
              "approximate attention mechanisms, ICML 2026, arXiv 2603.30033",
        official_code="ScSteffen/Tucker-Attention (not indexed here)",
        forward=tucker_attention_forward, backward=tucker_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/s8.md#tucker-attention",
        checks={"mha_special_case": _check_mha_special_case, "mqa_special_case": _check_mqa_special_case,
                "latent_rope_relative": _check_latent_rope_relative,
                "shared_kv_gradient": _check_shared_kv_gradient},
    ),
)
