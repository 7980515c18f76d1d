r"""Location-relative attention for long-form speech synthesis: GMM attention (V0, V1, V2) and
Dynamic Convolution Attention (DCA), recurrent over decoder steps, with the backward through time.

Paper: Battenberg, Skerry-Ryan, Mariooryad, Stanton, Kao, Shannon, Bagby, "Location-Relative Attention
Mechanisms for Robust Long-Form Speech Synthesis", ICASSP 2020, arXiv 1910.10288. The paper has no
official code; refattn follows two widely used TTS implementations:

* DCA: bshall/Tacotron ``tacotron/model.py`` @6fee34a7c3a9d4ceb9215ed3063771a9287010e1
  (``DynamicConvolutionAttention``; its ``config.toml`` gives the paper's sizes: static and dynamic
  filters 8 channels of width 21, attention width 128, prior length 11 with $\alpha=0.1$, $\beta=0.9$);
* GMM: LeoniusChen/Attentions-in-Tacotron ``gmm.py`` @82150125da901caf38c91647b9710b04bd572e8c
  (``GMMAttention`` with ``version`` ``'0'``/``'1'``/``'2'``, Table 1 of the paper).

Both attend over memory positions $j = 0..N-1$ with *content-free* keys: the alignment depends on
the decoder query $s_i$ (the attention-RNN state of step $i$, an input here; the RNN that
produces it is the decoder's) and on the previous step only. The context is
$c_i = \sum_j\alpha_{ij}m_j$ for the memory (encoder outputs) $m$. Output ``(B, T, D_m)``;
``cache["alpha"]`` holds the alignments ``(B, T, N)``.

GMM attention
-------------
An MLP ``mlp`` = Linear–tanh–Linear gives $(\hat w, \hat\Delta, \hat\sigma)\in\mathbb R^{3K}$ per
step (that order, $K$ each); then

| version | $w$ | $\Delta$ | $\sigma$ | $Z$ |
|---|---|---|---|---|
| ``"0"`` (Graves) | $e^{\hat w}$ | $e^{\hat\Delta}$ | $\sqrt{e^{-\hat\sigma}/2}$ | 1 |
| ``"1"`` | softmax | $e^{\hat\Delta}$ | $\sqrt{e^{\hat\sigma}}$ | $\sqrt{2\pi\sigma^2}$ |
| ``"2"`` (GMMv2, default) | softmax | softplus | softplus | $\sqrt{2\pi\sigma^2}$ |

with ``eps`` ($10^{-5}$) added to $\sigma$ as upstream, $\mu_i = \mu_{i-1} + \Delta_i$ ($\mu_0 = 0$) and

$$\alpha_{ij} = \sum_k\frac{w_{ik}}{Z_{ik}}\exp\!\Big(-\frac{(j-\mu_{ik})^2}{2\sigma_{ik}^2}\Big)$$

(not renormalised; with $Z$ it integrates to about 1 on a long grid). Masked memory positions
get ``masked_value`` ($10^{-8}$, upstream's ``score_mask_value``). The paper's GMMv2b bias
initialisation is an initialisation, not a layer change. Softplus is the exact
$\log(1+e^x)$ (PyTorch switches to the identity above 20: a difference below $2\cdot10^{-9}$).

Backward (through time by a reverse cumulative sum): with $n_{ikj} = e^{-x^2/2\sigma^2}/Z$,
$x = j - \mu_{ik}$ and $\bar\alpha = \partial\mathcal L/\partial\alpha$,
$\bar w_{ik} = \sum_j\bar\alpha_{ij}n_{ikj}$, $\bar\mu_{ik} = \sum_j\bar\alpha_{ij}w_{ik}n_{ikj}x/\sigma^2$,
$\bar\sigma_{ik} = \sum_j\bar\alpha_{ij}w_{ik}n_{ikj}(x^2/\sigma^3 - [Z\neq1]/\sigma)$,
$\bar\Delta_{ik} = \sum_{i'\ge i}\bar\mu_{i'k}$; then the maps of the table
(softplus$' = \sigma(\cdot)$, softmax VJP, $d\sqrt{e^{\pm\hat\sigma}}/d\hat\sigma = \pm(\sigma-\epsilon)/2$) and the MLP.

Dynamic Convolution Attention
-----------------------------
With $\alpha_{i-1}$ the previous alignment ($\alpha_0$ one-hot at position 0, as upstream):

$$f_i = F*\alpha_{i-1},\quad g_i = G(s_i)*\alpha_{i-1},\quad G(s_i) = \tanh(s_iW + b_W)V,\quad
p_i = \log\max(P*\alpha_{i-1},\ 10^{-6}),$$
$$e_{ij} = v^\top\tanh(f_{ij}U + g_{ij}T + b_T) + p_{ij},\qquad \alpha_i = \mathrm{softmax}_j(e_i),$$

$*$ a zero-padded ("same") cross-correlation: $F$ the static filters (``F.weight`` ``(8, 1, 21)``,
PyTorch's ``Conv1d`` layout), $G(s_i)$ reshaped ``(dynamic_channels, dynamic_kernel_size)`` per
sample (upstream's grouped ``conv1d``), and $P$ the fixed causal beta-binomial prior
($P_k = \mathrm{BetaBinom}(k;\,L-1, \alpha, \beta)$, $p_{ij} = \sum_kP_k\alpha_{i-1,j-k}$; ``F.pad``
by $L-1$ on the left and the flipped filter upstream). Masked memory positions get $-\infty$
before the softmax. Parameters as ``DynamicConvolutionAttention``'s ``state_dict`` (linear weights
``(in, out)``): ``W.*``, ``V.weight``, ``F.weight``, ``U.weight``, ``T.*``, ``v.weight``.

Backward through time: $\bar\alpha_i$ = (context and caller gradient) + what step $i+1$ sends
back; $\bar e_i$ = softmax VJP; the tanh MLP gives $\bar v, \bar U, \bar T, \bar b_T$, $\bar f$, $\bar g$;
each correlation's adjoint (the scatter-add of its window gradients) sends $\bar f$, $\bar g$ and
$\bar p/\max(P*\alpha_{i-1}, 10^{-6})$ (zero where the clamp is active) back to $\alpha_{i-1}$ and gives
$\bar F$ and $\bar G(s_i)$, then $\bar V$, $\bar W$, $\bar b_W$, $\bar s_i$. $\alpha_0$ is fixed.

The three correlations of a step read the same one-channel signal $\alpha_{i-1}$ ``(B, N)``, two of
them with per-sample or causal taps, so they are products with one zero-padded window view of it
(what `refattn.nn.conv.conv_apply` computes for this case, without its per-call setup, which
dominated the time of a decoder loop).

Agreement with upstream (measured)
---------------------------------
Upstream ``DynamicConvolutionAttention`` and ``GMMAttention`` run in float64 torch (CPU) over a
7-step decoder loop (B=3, N=12; DCA with the paper's 8x21 filters), output, alignments and every
gradient: DCA worst abs $8.9\cdot10^{-14}$ / rel $7.4\cdot10^{-15}$ (no mask) and $1.7\cdot10^{-14}$ /
$5.2\cdot10^{-15}$ (memory mask, applied as upstream's ``BahdanauAttention`` does) with the prior taps
in float64; with upstream's float32-stored prior (``torch.FloatTensor``) the difference is the
rounding of the taps, $1.5\cdot10^{-6}$ abs / $8.8\cdot10^{-8}$ rel. GMM ``version="0"`` $1.6\cdot10^{-13}$ /
$1.6\cdot10^{-15}$, ``"1"`` $8.0\cdot10^{-15}$ / $3.1\cdot10^{-15}$, ``"2"`` $2.4\cdot10^{-15}$ / $1.4\cdot10^{-15}$.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.stats import betabinom

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.activations import sigmoid
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "GMM_VERSIONS",
    "LOCATION_KINDS",
    "gmm_param_spec",
    "dca_param_spec",
    "init_gmm_params",
    "init_dca_params",
    "dca_prior_filter",
    "gmm_attention_forward",
    "gmm_attention_backward",
    "dca_attention_forward",
    "dca_attention_backward",
    "location_relative_attention_forward",
    "location_relative_attention_backward",
    "location_relative_attention",
]

GMM_VERSIONS = ("0", "1", "2")
LOCATION_KINDS = ("gmm", "dca")
_SQRT_2PI = float(np.sqrt(2.0 * np.pi))


def gmm_param_spec(query_dim: int, attn_dim: int, num_mixtures: int) -> dict:
    """``check_params`` spec of ``GMMAttention.mlp`` (``Linear``, ``Tanh``, ``Linear``)."""
    return {"mlp.0.weight": (query_dim, attn_dim), "mlp.0.bias": (attn_dim,),
            "mlp.2.weight": (attn_dim, 3 * num_mixtures), "mlp.2.bias": (3 * num_mixtures,)}


def dca_param_spec(query_dim: int, attn_dim: int, *, static_channels: int, static_kernel_size: int,
                   dynamic_channels: int, dynamic_kernel_size: int) -> dict:
    """``check_params`` spec of ``DynamicConvolutionAttention`` (bshall/Tacotron names)."""
    return {"W.weight": (query_dim, attn_dim), "W.bias": (attn_dim,),
            "V.weight": (attn_dim, dynamic_channels * dynamic_kernel_size),
            "F.weight": (static_channels, 1, static_kernel_size), "U.weight": (static_channels, attn_dim),
            "T.weight": (dynamic_channels, attn_dim), "T.bias": (attn_dim,), "v.weight": (attn_dim, 1)}


def _init(rng, spec, scale):
    return {k: (scale / np.sqrt(shp[0] if len(shp) == 2 else shp[-1])) * rng.standard_normal(shp) if len(shp) > 1
            else 0.1 * rng.standard_normal(shp) for k, shp in spec.items()}


def init_gmm_params(rng, query_dim: int, attn_dim: int, num_mixtures: int, *, scale: float = 1.0) -> dict:
    """Random GMM parameters in spec order."""
    return _init(rng, gmm_param_spec(query_dim, attn_dim, num_mixtures), scale)


def init_dca_params(rng, query_dim: int, attn_dim: int, *, static_channels: int = 8, static_kernel_size: int = 21,
                    dynamic_channels: int = 8, dynamic_kernel_size: int = 21, scale: float = 1.0) -> dict:
    """Random DCA parameters in spec order (defaults: the paper's filter sizes)."""
    return _init(rng, dca_param_spec(query_dim, attn_dim, static_channels=static_channels,
                                     static_kernel_size=static_kernel_size, dynamic_channels=dynamic_channels,
                                     dynamic_kernel_size=dynamic_kernel_size), scale)


def dca_prior_filter(prior_length: int = 11, alpha: float = 0.1, beta: float = 0.9) -> np.ndarray:
    r"""The causal prior taps $P_k = \mathrm{BetaBinom}(k;\,L-1,\alpha,\beta)$, $k = 0..L-1$ ($P_0$ weighs
    the previous alignment at the same position)."""
    return _prior_taps(int(prior_length), float(alpha), float(beta)).copy()


@lru_cache(maxsize=16)
def _prior_taps(length, alpha, beta):
    return betabinom.pmf(np.arange(length), length - 1, alpha, beta)


def _windows(x: np.ndarray, before: int, after: int, k: int) -> np.ndarray:
    """``(B, N) -> (B, N, k)``: the zero-padded length-``k`` window read at every output position
    (``before + after = k - 1``); the three correlations of a DCA step are products with it."""
    b, n = x.shape
    xp = np.zeros((b, n + before + after), x.dtype)
    xp[:, before:before + n] = x
    s0, s1 = xp.strides
    return np.lib.stride_tricks.as_strided(xp, (b, n, k), (s0, s1, s1), writeable=False)


def _windows_vjp(dwin: np.ndarray, before: int, n: int) -> np.ndarray:
    """Adjoint of :func:`_windows`: scatter-add ``dwin (B, N, k)`` back onto the signal ``(B, N)``."""
    k = dwin.shape[-1]
    dxp = np.zeros((dwin.shape[0], n + k - 1), dwin.dtype)
    for i in range(k):
        dxp[:, i:i + n] += dwin[..., i]
    return dxp[:, before:before + n]


def _inputs(query, memory, memory_mask):
    q = as_float(query, "query", ndim=3)
    m = as_float(memory, "memory", ndim=3)
    if m.shape[0] != q.shape[0]:
        raise ValueError(f"memory must have query's batch size {q.shape[0]} on axis 0; got shape {m.shape}")
    if memory_mask is not None:
        memory_mask = np.asarray(memory_mask)
        if memory_mask.dtype != np.bool_:
            raise TypeError(f"memory_mask must be a boolean array (True = valid); got dtype {memory_mask.dtype}")
        if memory_mask.shape != m.shape[:2]:
            raise ValueError(f"memory_mask must have shape (B, N) = {m.shape[:2]}; got {memory_mask.shape}")
    return q, m, memory_mask


def _softplus(x):
    return np.logaddexp(0.0, x).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# GMM attention


def gmm_attention_forward(query, memory, params, *, version: str = "2", eps: float = 1e-5, memory_mask=None,
                          masked_value: float = 1e-8):
    r"""GMM attention over all decoder steps (LeoniusChen ``GMMAttention``; module docstring).

    Parameters
    ----------
    query : array (B, T, D_q)
        Attention-RNN state $s_i$ of each decoder step.
    memory : array (B, N, D_m)
        Encoder outputs (values; the keys are the positions $0..N-1$).
    params : dict
        ``gmm_param_spec`` keys; $K$ = ``mlp.2.weight.shape[1] // 3``.
    version : {"0", "1", "2"}
    eps : float
        Added to $\sigma$.
    memory_mask : bool array (B, N), optional
        True = valid; invalid positions get ``masked_value``.

    Returns
    -------
    contexts, cache
        ``(B, T, D_m)``; ``cache["alpha"]`` the alignments ``(B, T, N)``.
    """
    q, m, memory_mask = _inputs(query, memory, memory_mask)
    check_choice(version, "version", GMM_VERSIONS)
    eps = check_positive(eps, "eps", allow_zero=True)
    masked_value = float(masked_value)
    if not isinstance(params, dict) or np.ndim(params.get("mlp.2.weight")) != 2:
        raise TypeError("params must be a dict with 'mlp.2.weight' (attn_dim, 3K) (see gmm_param_spec)")
    a_dim, k3 = np.shape(params["mlp.2.weight"])
    if k3 % 3:
        raise ValueError(f"mlp.2.weight must have 3K columns (w, delta, sigma); got shape {(a_dim, k3)}")
    k = k3 // 3
    p = check_params(params, gmm_param_spec(q.shape[-1], a_dim, k), where="gmm_attention (GMMAttention)")
    dt = compute_dtype(q, m, *p.values())
    q, m, p = q.astype(dt, copy=False), m.astype(dt, copy=False), cast_all(dt, p)
    hid = np.tanh(q @ p["mlp.0.weight"] + p["mlp.0.bias"])
    raw = hid @ p["mlp.2.weight"] + p["mlp.2.bias"]
    w_hat, d_hat, s_hat = raw[..., :k], raw[..., k:2 * k], raw[..., 2 * k:]
    if version == "2":
        sig, delta = _softplus(s_hat) + eps, _softplus(d_hat)
    elif version == "1":
        sig, delta = np.exp(0.5 * s_hat) + eps, np.exp(d_hat)
    else:
        sig, delta = np.exp(-0.5 * s_hat) * float(np.sqrt(0.5)) + eps, np.exp(d_hat)
    w = np.exp(w_hat) if version == "0" else softmax_lse(w_hat, axis=-1)[0]
    mu = np.cumsum(delta, axis=1)                                      # (B, T, K)
    x = np.arange(m.shape[1], dtype=dt) - mu[..., None]                # (B, T, K, N)
    nrm = np.exp(-x * x / (2.0 * sig[..., None] ** 2))
    if version != "0":
        nrm = nrm / (_SQRT_2PI * sig[..., None])
    alpha = np.einsum("btk,btkn->btn", w, nrm)
    if memory_mask is not None:
        alpha = np.where(memory_mask[:, None, :], alpha, masked_value).astype(dt, copy=False)
    ctx = alpha @ m
    cache = {"kind": "gmm", "q": q, "m": m, "p": p, "hid": hid, "raw": raw, "sig": sig, "delta": delta, "w": w,
             "x": x, "nrm": nrm, "alpha": alpha, "mask": memory_mask, "version": version, "eps": eps, "k": k,
             "shape": ctx.shape}
    return ctx, cache


def gmm_attention_backward(dout, cache, *, dalpha=None):
    """Gradient of :func:`gmm_attention_forward` (through time: a reverse cumulative sum over the
    steps); ``dalpha`` (optional, (B, T, N)) is an extra upstream gradient on the alignments."""
    q, m, p, alpha = cache["q"], cache["m"], cache["p"], cache["alpha"]
    g = as_dout(dout, cache["shape"], q.dtype)
    dmem = np.einsum("btn,btd->bnd", alpha, g)
    dal = g @ np.swapaxes(m, -1, -2)
    if dalpha is not None:
        dal = dal + as_dout(dalpha, alpha.shape, q.dtype, name="dalpha")
    if cache["mask"] is not None:
        dal = np.where(cache["mask"][:, None, :], dal, 0.0)
    w, nrm, x, sig, version = cache["w"], cache["nrm"], cache["x"], cache["sig"], cache["version"]
    an = dal[:, :, None, :] * nrm                                       # (B, T, K, N)
    dw = an.sum(axis=-1)
    wan = w[..., None] * an
    s2 = sig[..., None] ** 2
    dmu = np.sum(wan * x / s2, axis=-1)
    dsig = np.sum(wan * (x * x / (s2 * sig[..., None])), axis=-1)
    if version != "0":
        dsig = dsig - np.sum(wan, axis=-1) / sig
    ddelta = np.flip(np.cumsum(np.flip(dmu, axis=1), axis=1), axis=1)
    k, raw = cache["k"], cache["raw"]
    if version == "2":
        ds_hat, dd_hat = dsig * sigmoid(raw[..., 2 * k:]), ddelta * sigmoid(raw[..., k:2 * k])
    else:
        ds_hat = dsig * (0.5 if version == "1" else -0.5) * (sig - cache["eps"])
        dd_hat = ddelta * cache["delta"]
    dw_hat = dw * w if version == "0" else softmax_vjp(w, dw)
    draw = np.concatenate([dw_hat, dd_hat, ds_hat], axis=-1)
    hid = cache["hid"]
    grads = {"mlp.2.weight": hid.reshape(-1, hid.shape[-1]).T @ draw.reshape(-1, draw.shape[-1]),
             "mlp.2.bias": draw.sum(axis=(0, 1))}
    dpre = (draw @ p["mlp.2.weight"].T) * (1.0 - hid * hid)
    grads["mlp.0.weight"] = q.reshape(-1, q.shape[-1]).T @ dpre.reshape(-1, dpre.shape[-1])
    grads["mlp.0.bias"] = dpre.sum(axis=(0, 1))
    return {"query": dpre @ p["mlp.0.weight"].T, "memory": dmem, **{kk: grads[kk] for kk in p}}


# --------------------------------------------------------------------------------------------
# Dynamic Convolution Attention


def dca_attention_forward(query, memory, params, *, prior_length: int = 11, prior_alpha: float = 0.1,
                          prior_beta: float = 0.9, prior_floor: float = 1e-6, memory_mask=None,
                          initial_alignment=None):
    r"""Dynamic Convolution Attention over all decoder steps (bshall ``DynamicConvolutionAttention``).

    Parameters
    ----------
    query : array (B, T, D_q)
        Attention-RNN state $s_i$ of each decoder step.
    memory : array (B, N, D_m)
        Encoder outputs.
    params : dict
        ``dca_param_spec`` keys; the channel counts and (odd) kernel sizes are read from the shapes.
    prior_length, prior_alpha, prior_beta : int, float, float
        The beta-binomial prior filter (11, 0.1, 0.9).
    prior_floor : float
        The clamp inside the log-prior ($10^{-6}$).
    memory_mask : bool array (B, N), optional
        True = valid; invalid positions get $-\infty$ before the softmax.
    initial_alignment : array (B, N), optional
        $\alpha_0$ (not differentiated); default one-hot at position 0, as upstream.

    Returns
    -------
    contexts, cache
        ``(B, T, D_m)``; ``cache["alpha"]`` the alignments ``(B, T, N)``.
    """
    q, m, memory_mask = _inputs(query, memory, memory_mask)
    lp = check_size(prior_length, "prior_length")
    pa, pb = check_positive(prior_alpha, "prior_alpha"), check_positive(prior_beta, "prior_beta")
    floor = check_positive(prior_floor, "prior_floor")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see dca_param_spec); got {type(params).__name__}")
    shp = {k: np.shape(params.get(k)) for k in ("W.weight", "V.weight", "F.weight", "T.weight")}
    if len(shp["W.weight"]) != 2 or len(shp["F.weight"]) != 3 or len(shp["T.weight"]) != 2:
        raise ValueError("params must hold 'W.weight' (D_q, A), 'F.weight' (C_s, 1, k_s) and 'T.weight' (C_d, A) "
                         f"(see dca_param_spec); got shapes {shp}")
    check_weight_in(params, "W.weight", q.shape[-1], input_name="query")
    a_dim, (sc, _, sk), dc = shp["W.weight"][1], shp["F.weight"], shp["T.weight"][0]
    if len(shp["V.weight"]) == 2:
        check_weight_in(params, "V.weight", a_dim, input_name=f"the attention state (W.weight's output, A = {a_dim})")
    if shp["T.weight"][1] != a_dim:  # (C_d, A): its output axis is W's A; C_d is read off axis 0
        hint = (f" (PyTorch's nn.Linear.weight is (out, in): pass its transpose, of shape {shp['T.weight'][::-1]})"
                if shp["T.weight"][0] == a_dim else "")
        raise ValueError(f"T.weight must have shape (C_d, A={a_dim}) (refattn weights are (in, out); A is W.weight's "
                         f"output width); got {shp['T.weight']}{hint}")
    if min(a_dim, sc, sk, dc) < 1:
        raise ValueError("params 'W.weight', 'F.weight' and 'T.weight' must have non-empty axes "
                         f"(see dca_param_spec); got shapes {shp}")
    if len(shp["V.weight"]) != 2 or shp["V.weight"][1] % dc:
        raise ValueError(f"V.weight must have shape (A, C_d * k_d) with C_d = {dc}; got {shp['V.weight']}")
    dk = shp["V.weight"][1] // dc
    for ks, name in ((sk, "F.weight"), (dk, "V.weight")):
        if ks % 2 == 0:
            raise ValueError(f"{name} must give an odd kernel size (the 'same' padding (k - 1) // 2); got {ks}")
    p = check_params(params, dca_param_spec(q.shape[-1], a_dim, static_channels=sc, static_kernel_size=sk,
                                            dynamic_channels=dc, dynamic_kernel_size=dk),
                     where="dca_attention (DynamicConvolutionAttention)")
    b, n = m.shape[:2]
    if initial_alignment is not None:
        a0 = as_float(initial_alignment, "initial_alignment", ndim=2)
        if a0.shape != (b, n):
            raise ValueError(f"initial_alignment must have shape (B, N) = {(b, n)}; got {a0.shape}")
    dt = compute_dtype(q, m, *p.values())
    q, m, p = q.astype(dt, copy=False), m.astype(dt, copy=False), cast_all(dt, p)
    prev = np.zeros((b, n), dt)
    if initial_alignment is None:
        prev[:, 0] = 1.0
    else:
        prev = a0.astype(dt)
    taps = _prior_taps(lp, pa, pb).astype(dt)
    cfg = {"lp": lp, "sk": sk, "dk": dk, "dc": dc, "floor": floor, "taps": taps}
    fk = p["F.weight"][:, 0, :]                                          # (C_s, k_s)
    steps, alphas = [], []
    for t in range(q.shape[1]):
        pr = _windows(prev, lp - 1, 0, lp) @ taps[::-1]                  # sum_k P_k alpha_{j-k}
        hq = np.tanh(q[:, t] @ p["W.weight"] + p["W.bias"])
        gk = (hq @ p["V.weight"]).reshape(b, dc, dk)
        f = _windows(prev, (sk - 1) // 2, sk // 2, sk) @ fk.T             # (B, N, C_s)
        g = np.einsum("bnk,bck->bnc", _windows(prev, (dk - 1) // 2, dk // 2, dk), gk)
        th = np.tanh(f @ p["U.weight"] + g @ p["T.weight"] + p["T.bias"])
        e = th @ p["v.weight"][:, 0] + np.log(np.maximum(pr, floor))
        if memory_mask is not None:
            e = np.where(memory_mask, e, -np.inf)
        alpha, _ = softmax_lse(e, axis=-1)
        steps.append({"prev": prev, "pr": pr, "hq": hq, "gk": gk, "f": f, "g": g, "th": th})
        alphas.append(alpha)
        prev = alpha
    alpha = np.stack(alphas, axis=1)
    ctx = alpha @ m
    cache = {"kind": "dca", "q": q, "m": m, "p": p, "alpha": alpha, "steps": steps, "cfg": cfg, "shape": ctx.shape}
    return ctx, cache


def dca_attention_backward(dout, cache, *, dalpha=None):
    """Gradient of :func:`dca_attention_forward` by backpropagation through the decoder steps;
    ``dalpha`` (optional, (B, T, N)) is an extra upstream gradient on the alignments."""
    q, m, p, alpha, cfg = cache["q"], cache["m"], cache["p"], cache["alpha"], cache["cfg"]
    g = as_dout(dout, cache["shape"], q.dtype)
    dmem = np.einsum("btn,btd->bnd", alpha, g)
    dal = g @ np.swapaxes(m, -1, -2)
    if dalpha is not None:
        dal = dal + as_dout(dalpha, alpha.shape, q.dtype, name="dalpha")
    grads = {k: np.zeros_like(v) for k, v in p.items()}
    dq = np.zeros_like(q)
    b, n = m.shape[:2]
    dc, dk, sk, lp = cfg["dc"], cfg["dk"], cfg["sk"], cfg["lp"]
    carry = np.zeros((b, n), q.dtype)
    for t in range(q.shape[1] - 1, -1, -1):
        st = cache["steps"][t]
        prev, th = st["prev"], st["th"]
        de = softmax_vjp(alpha[:, t], dal[:, t] + carry)
        grads["v.weight"][:, 0] += np.einsum("bn,bna->a", de, th)
        dpre = de[..., None] * p["v.weight"][:, 0] * (1.0 - th * th)      # (B, N, A)
        grads["U.weight"] += st["f"].reshape(-1, st["f"].shape[-1]).T @ dpre.reshape(-1, dpre.shape[-1])
        grads["T.weight"] += st["g"].reshape(-1, dc).T @ dpre.reshape(-1, dpre.shape[-1])
        grads["T.bias"] += dpre.sum(axis=(0, 1))
        df = dpre @ p["U.weight"].T                                        # (B, N, C_s)
        dg = dpre @ p["T.weight"].T                                        # (B, N, C_d)
        dpr = np.where(st["pr"] >= cfg["floor"], de / np.maximum(st["pr"], cfg["floor"]), 0.0)
        dprev = _windows_vjp(dpr[..., None] * cfg["taps"][::-1], lp - 1, n)
        wf = _windows(prev, (sk - 1) // 2, sk // 2, sk)
        grads["F.weight"][:, 0, :] += df.reshape(-1, df.shape[-1]).T @ wf.reshape(-1, sk)
        dprev += _windows_vjp(df @ p["F.weight"][:, 0, :], (sk - 1) // 2, n)
        wg = _windows(prev, (dk - 1) // 2, dk // 2, dk)
        dgk = np.einsum("bnc,bnk->bck", dg, wg).reshape(b, dc * dk)
        dprev += _windows_vjp(np.einsum("bnc,bck->bnk", dg, st["gk"]), (dk - 1) // 2, n)
        hq = st["hq"]
        grads["V.weight"] += hq.T @ dgk
        dhq = (dgk @ p["V.weight"].T) * (1.0 - hq * hq)
        grads["W.weight"] += q[:, t].T @ dhq
        grads["W.bias"] += dhq.sum(axis=0)
        dq[:, t] = dhq @ p["W.weight"].T
        carry = dprev
    return {"query": dq, "memory": dmem, **grads}


# --------------------------------------------------------------------------------------------
# One entry point for the record


_GMM_ONLY = ("version", "eps", "masked_value")
_DCA_ONLY = ("prior_length", "prior_alpha", "prior_beta", "prior_floor", "initial_alignment")


def location_relative_attention_forward(query, memory, params, *, kind=None, version=None, eps=None,
                                        masked_value=None, prior_length=None, prior_alpha=None, prior_beta=None,
                                        prior_floor=None, initial_alignment=None, memory_mask=None):
    """GMM attention or DCA, chosen by ``kind`` (``"gmm"``/``"dca"``) or, when None, by the
    parameter names (``mlp.*`` = GMM, ``W.*``/``V.*``/``F.*`` = DCA). The keywords go to
    :func:`gmm_attention_forward` (``version``, ``eps``, ``masked_value``) or :func:`dca_attention_forward`
    (``prior_*``, ``initial_alignment``), ``memory_mask`` to both; None keeps that function's default,
    and a keyword of the other kind raises ``TypeError``."""
    if kind is None:
        if not isinstance(params, dict):
            raise TypeError(f"params must be a dict (see gmm_param_spec / dca_param_spec); got {type(params).__name__}")
        kind = "gmm" if "mlp.0.weight" in params else "dca"
    check_choice(kind, "kind", LOCATION_KINDS)
    given = {k: v for k, v in dict(version=version, eps=eps, masked_value=masked_value, prior_length=prior_length,
                                   prior_alpha=prior_alpha, prior_beta=prior_beta, prior_floor=prior_floor,
                                   initial_alignment=initial_alignment).items() if v is not None}
    other = sorted(k for k in given if k in (_DCA_ONLY if kind == "gmm" else _GMM_ONLY))
    if other:
        raise TypeError(f"location_relative_attention_forward: {other} do not apply to kind={kind!r}")
    fn = gmm_attention_forward if kind == "gmm" else dca_attention_forward
    return fn(query, memory, params, memory_mask=memory_mask, **given)


def location_relative_attention_backward(dout, cache, *, dalpha=None):
    """Gradient of :func:`location_relative_attention_forward` (``query``, ``memory``, every parameter)."""
    fn = gmm_attention_backward if cache["kind"] == "gmm" else dca_attention_backward
    return fn(dout, cache, dalpha=dalpha)


def location_relative_attention(query, memory, params, **config) -> np.ndarray:
    """Convenience wrapper: the contexts of :func:`location_relative_attention_forward`."""
    return location_relative_attention_forward(query, memory, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_kind(rng, size, kind, version=None):
    b = 2
    if size == "tiny":
        t, n, dq, dm, a = 3, 5, 2, 2, 3
    else:
        t, n, dq, dm, a = int(rng.integers(3, 7)), int(rng.integers(6, 14)), 4, 3, 5
    cfg = {}
    if kind == "gmm":
        p = init_gmm_params(rng, dq, a, 2 if size == "tiny" else 3, scale=1.0)
        cfg["version"] = str(rng.choice(GMM_VERSIONS)) if version is None else version
    else:
        ks = 3 if size == "tiny" else 5
        p = init_dca_params(rng, dq, a, static_channels=2, static_kernel_size=ks, dynamic_channels=2,
                            dynamic_kernel_size=ks, scale=1.5)
    if size == "small" and rng.random() < 0.5:
        cfg["memory_mask"] = np.arange(n)[None, :] < np.array([n, n - 2])[:, None]
    return Sample(inputs={"query": rng.standard_normal((b, t, dq)), "memory": rng.standard_normal((b, n, dm))},
                  params=p, config=cfg)


def _sample(rng, size):
    return _sample_kind(rng, size, "gmm" if rng.random() < 0.5 else "dca")


def _reference(query, memory, params, **config):
    # Step by step with explicit loops: GMM from the running mean, DCA from explicit sums over taps.
    b, t, _ = query.shape
    n = memory.shape[1]
    mask = config.get("memory_mask")
    al = np.zeros((b, t, n))
    if "mlp.0.weight" in params:
        ver, k = config.get("version", "2"), params["mlp.2.weight"].shape[1] // 3
        for bb in range(b):
            mu = np.zeros(k)
            for tt in range(t):
                r = np.tanh(query[bb, tt] @ params["mlp.0.weight"] + params["mlp.0.bias"]) @ params["mlp.2.weight"] \
                    + params["mlp.2.bias"]
                wh, dh, sh = r[:k], r[k:2 * k], r[2 * k:]
                if ver == "2":
                    sig, dlt = np.log1p(np.exp(sh)) + 1e-5, np.log1p(np.exp(dh))
                elif ver == "1":
                    sig, dlt = np.sqrt(np.exp(sh)) + 1e-5, np.exp(dh)
                else:
                    sig, dlt = np.sqrt(np.exp(-sh) / 2) + 1e-5, np.exp(dh)
                w = np.exp(wh) if ver == "0" else np.exp(wh) / np.exp(wh).sum()
                z = np.ones(k) if ver == "0" else np.sqrt(2 * np.pi * sig ** 2)
                mu = mu + dlt
                for j in range(n):
                    ok = mask is None or mask[bb, j]
                    al[bb, tt, j] = sum(w[c] / z[c] * np.exp(-(j - mu[c]) ** 2 / sig[c] ** 2 / 2) for c in range(k)) \
                        if ok else 1e-8
        return al @ memory
    P = dca_prior_filter(11, 0.1, 0.9)
    fw = params["F.weight"]
    sc, _, sk = fw.shape
    dc = params["T.weight"].shape[0]
    dk = params["V.weight"].shape[1] // dc

    def tap(a, j):
        return a[j] if 0 <= j < n else 0.0
    for bb in range(b):
        prev = np.eye(n)[0]
        for tt in range(t):
            gk = (np.tanh(query[bb, tt] @ params["W.weight"] + params["W.bias"]) @ params["V.weight"]).reshape(dc, dk)
            e = np.empty(n)
            for j in range(n):
                f = np.array([sum(fw[c, 0, i] * tap(prev, j + i - (sk - 1) // 2) for i in range(sk)) for c in range(sc)])
                g = np.array([sum(gk[c, i] * tap(prev, j + i - (dk - 1) // 2) for i in range(dk)) for c in range(dc)])
                pr = sum(P[kk] * tap(prev, j - kk) for kk in range(11))
                e[j] = np.tanh(f @ params["U.weight"] + g @ params["T.weight"] + params["T.bias"]) \
                    @ params["v.weight"][:, 0] + np.log(max(pr, 1e-6))
            ok = np.ones(n, bool) if mask is None else mask[bb]
            w = np.where(ok, np.exp(e - e[ok].max()), 0.0)
            prev = w / w.sum()
            al[bb, tt] = prev
    return al @ memory


def _check_gmm_gradcheck_all_versions(rng):
    # The generated FD test sees one kind per seed: here every GMM version, backward through time.
    from ...testing import gradcheck
    return max(gradcheck(gmm_attention_forward, gmm_attention_backward, _sample_kind(rng, "tiny", "gmm", v)).max_rel
               for v in GMM_VERSIONS)


def _check_dca_gradcheck(rng):
    from ...testing import gradcheck
    s = _sample_kind(rng, "tiny", "dca")
    return gradcheck(dca_attention_forward, dca_attention_backward, s).max_rel


def _check_alignment_gradcheck_through_time(rng):
    # A loss on the alignments themselves (dalpha): every step's alpha depends on the earlier ones.
    from ...testing import gradcheck
    worst = 0.0
    for kind in LOCATION_KINDS:
        s = _sample_kind(rng, "tiny", kind)
        gw = rng.standard_normal((2, 3, 5))

        def fwd(query, memory, params, _kind=kind, _gw=gw, **cfg):
            ctx, c = location_relative_attention_forward(query, memory, params, kind=_kind, **cfg)
            return np.array([np.sum(_gw * c["alpha"])]), c

        def bwd(dout, c, _gw=gw):
            return location_relative_attention_backward(np.zeros(c["shape"]), c, dalpha=dout[0] * _gw)

        worst = max(worst, gradcheck(fwd, bwd, s).max_rel)
    return worst


def _check_dca_rows_sum_to_one(rng):
    s = _sample_kind(rng, "small", "dca")
    _, c = dca_attention_forward(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(c["alpha"].sum(-1) - 1.0).max())
    assert err < 1e-12, f"DCA alignment rows do not sum to 1 ({err:.2e})"
    return err


def _check_gmm_integrates_to_one_and_monotone_mean(rng):
    # V1/V2 normalise each Gaussian: with the means far inside a long grid (the MLP's mean-step and
    # width outputs pinned by their biases: steps ~30, widths ~2) the alignment sums to 1; the
    # means only move forward (Delta > 0) for any parameters.
    worst = 0.0
    for ver in ("1", "2"):
        s = _sample_kind(rng, "small", "gmm", ver)
        _, c = gmm_attention_forward(**s.inputs, params=s.params, version=ver)
        assert np.all(c["delta"] > 0), "a GMM mean moved backwards"
        k = s.params["mlp.2.bias"].shape[0] // 3
        w2 = s.params["mlp.2.weight"].copy()
        w2[:, k:] = 0.0
        pin = [30.0, 2.0] if ver == "2" else [np.log(30.0), 1.5]
        b2 = np.concatenate([s.params["mlp.2.bias"][:k], np.repeat(pin, k)])
        p = dict(s.params, **{"mlp.2.weight": w2, "mlp.2.bias": b2})
        _, c = gmm_attention_forward(s.inputs["query"], np.zeros((2, 400, 3)), p, version=ver)
        worst = max(worst, float(np.abs(c["alpha"].sum(-1) - 1.0).max()))
    assert worst < 1e-9, f"GMM alignments do not integrate to 1 on a long grid ({worst:.2e})"
    return worst


register(
    Mechanism(
        slug="gmm_dca_location_attention", family="1-softmax", tier="T2",
        official_code="none official; ports followed: bshall/Tacotron tacotron/model.py@6fee34a (DCA), LeoniusChen/Attentions-in-Tacotron gmm.py@8215012 (GMM)",
        title="Location-relative attention: GMM (V0/V1/V2) and Dynamic Convolution Attention, backward through time",
        paper="Battenberg, Skerry-Ryan, Mariooryad, Stanton, Kao, Shannon, Bagby, Location-Relative Attention "
              "Mechanisms for Robust Long-Form Speech Synthesis, ICASSP 2020, arXiv 1910.10288",
        forward=location_relative_attention_forward, backward=location_relative_attention_backward,
        sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#location-relative-attention-gmm-and-dca",
        checks={"gmm_gradcheck_all_versions": _check_gmm_gradcheck_all_versions,
                "dca_gradcheck": _check_dca_gradcheck,
                "alignment_gradcheck_through_time": _check_alignment_gradcheck_through_time,
                "dca_rows_sum_to_one": _check_dca_rows_sum_to_one,
                "gmm_integrates_to_one_and_monotone_mean": _check_gmm_integrates_to_one_and_monotone_mean},
    ),
)
