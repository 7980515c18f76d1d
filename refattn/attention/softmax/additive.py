r"""Additive (MLP-score) soft attention: Bahdanau et al.'s score, as the soft attention of
*Show, Attend and Tell*, with its gate ("selector") and the doubly-stochastic regulariser.

Papers: Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel, Bengio, "Show, Attend and Tell: Neural
Image Caption Generation with Visual Attention", ICML 2015, arXiv 1502.03044; the score is the one of
Bahdanau, Cho, Bengio, "Neural Machine Translation by Jointly Learning to Align and Translate",
ICLR 2015, arXiv 1409.0473. Upstream: kelvinxu/arctic-captions ``capgen.py``
@f4565bfeba9098f54ce9c2495c55aa411fba39b0 (``param_init_lstm_cond``, the attention part of
``lstm_cond_layer._step`` with ``attn_type="deterministic"``, and the ``alpha_c`` term of ``train``).

Forward
-------
Annotation vectors $a_i\in\mathbb R^{D}$ ($i = 1..L$, e.g. the $14\times14$ conv features) and the
decoder state before each step, $h_{t-1}\in\mathbb R^{n}$ ($t = 1..T$; the LSTM that produces it is not
part of the attention and its states are an input here):

$$c_i = a_iW_c + b,\qquad e_{ti} = \tanh\!\big(c_i + h_{t-1}W_d\big)\,U + c_{tt},\qquad
\alpha_t = \mathrm{softmax}_i(e_t),$$
$$\beta_t = \sigma(h_{t-1}w_{\rm sel} + b_{\rm sel})\ \text{(``selector=True``)},\qquad
z_t = \beta_t\sum_i\alpha_{ti}a_i .$$

With ``n_layers_att = m > 1`` capgen's "deep attention" maps the projected context through
$m-1$ more ``tanh`` layers, $c \leftarrow \tanh(cW_{{\rm att},l} + b_{{\rm att},l})$, before adding the
state. Parameters, with capgen's names (its ``npz`` prefixes them with ``decoder_``; Theano weights
are already ``(in, out)``): ``Wc_att (D, D)``, ``b_att (D,)``, ``Wd_att (n, D)``, ``U_att (D, 1)``,
``c_tt (1,)``, optional ``W_sel (n, 1)`` and ``b_sel (1,)`` (capgen stores a 0-d scalar), optional
``W_att_l (D, D)``, ``b_att_l (D,)`` for $l = 1..m-1$. ``mask`` (B, L), True = keep, removes
annotation vectors (an addition; capgen's image grid has none). The hard (REINFORCE) attention of the
paper is stochastic and out of scope.

Doubly-stochastic regulariser
-----------------------------
$\lambda\sum_i\big(1 - \sum_t\alpha_{ti}\big)^2$ per sample (the paper). capgen adds
``alpha_c * ((1 - alphas.sum(0))**2).sum(0).mean()`` with ``alphas (T, B, L)``: a sum over the
batch and a *mean* over the locations. `doubly_stochastic_penalty_forward` returns the per-sample
term ``(B,)``; ``normalize="mean"`` (capgen) divides by $L$ so that its batch sum is capgen's value,
``normalize="sum"`` is the paper's. Its gradient is
$\partial/\partial\alpha_{ti} = -2\lambda'(1 - \sum_{t'}\alpha_{t'i})$ ($\lambda' = \lambda$ or
$\lambda/L$) for every $t$: it couples all the steps, and enters the layer's backward through
``dalpha``.

Backward
--------
With $G = \partial\mathcal L/\partial z$ and $z' = \alpha a$: $d\beta = \sum_D G\odot z'$ (then the
sigmoid and the linear gate), $dz' = \beta G$, $d\alpha = dz'\,a^\top$ (plus an upstream ``dalpha``),
$da \mathrel{+}= \alpha^\top dz'$, $de = \alpha\odot(d\alpha - \sum_i\alpha\,d\alpha)$ (softmax VJP). The score
is the *separable* tanh MLP of `additive_scores`: with $\theta_{ti} = \tanh(c_i + s_t)$,
$dU = \sum_{t,i}de_{ti}\theta_{ti}$, $dc_{tt} = \sum de$, $d\mathrm{pre}_{ti} = de_{ti}\,U^\top\odot(1-\theta_{ti}^2)$,
$dc_i = \sum_t d\mathrm{pre}_{ti}$, $ds_t = \sum_i d\mathrm{pre}_{ti}$ — the $O(BTLD)$ tensor is formed once.
Then $dW_d = h^\top ds$, $dh \mathrel{+}= ds\,W_d^\top$, and the context projections (through the deep
layers' ``tanh``) give $dW_c$, $db$ and $da \mathrel{+}= dc\,W_c^\top$.

Agreement with upstream (measured)
---------------------------------
capgen is Theano and does not run here: its ``_step`` attention and the ``alpha_c`` term were
transcribed into a float64 torch scratch script (B=3, T=4, L=6, n=5, D=7) and compared with
`soft_attention_forward`/`soft_attention_backward`, output and every gradient: worst abs
$2.3\cdot10^{-15}$ / rel $6.8\cdot10^{-16}$ (no selector), $1.1\cdot10^{-15}$ / $3.8\cdot10^{-16}$
(selector), $5.6\cdot10^{-16}$ / $8.1\cdot10^{-16}$ (selector, ``n_layers_att=3``); the
doubly-stochastic penalty (``normalize="mean"``, batch-summed) agrees to $5.6\cdot10^{-17}$.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.activations import sigmoid
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = [
    "additive_scores",
    "additive_scores_vjp",
    "soft_attention_param_spec",
    "init_soft_attention_params",
    "soft_attention_forward",
    "soft_attention_backward",
    "soft_attention",
    "doubly_stochastic_penalty_forward",
    "doubly_stochastic_penalty_backward",
]

PENALTY_NORMALIZATIONS = ("mean", "sum")


# --------------------------------------------------------------------------------------------
# The separable tanh score (shared with the other additive mechanisms of the family)


def additive_scores(qp: np.ndarray, kp: np.ndarray, v: np.ndarray, bias=None):
    r"""Unvalidated separable additive score $e_{ti} = \tanh(q_t + k_i)\,v\,(+\,b)$.

    ``qp (..., T, A)`` and ``kp (..., L, A)`` are the already projected query and key terms,
    ``v (A,)``, ``bias`` a scalar array or None. Returns ``(e (..., T, L), th (..., T, L, A))``;
    ``th`` is what `additive_scores_vjp` needs.
    """
    th = np.tanh(qp[..., :, None, :] + kp[..., None, :, :])
    e = th @ v
    if bias is not None:
        e = e + bias
    return e, th


def additive_scores_vjp(de: np.ndarray, th: np.ndarray, v: np.ndarray):
    r"""Gradients of `additive_scores` for upstream ``de (..., T, L)``:
    ``(dqp (..., T, A), dkp (..., L, A), dv (A,), dbias (scalar))`` with the leading axes summed
    for ``dv`` and ``dbias``."""
    dv = (de[..., None] * th).reshape(-1, th.shape[-1]).sum(axis=0)
    dpre = (de[..., None] * v) * (1.0 - th * th)
    return dpre.sum(axis=-2), dpre.sum(axis=-3), dv, de.sum()


# --------------------------------------------------------------------------------------------
# Show, Attend and Tell soft attention


def soft_attention_param_spec(dim: int, dimctx: int, *, selector: bool = False, n_layers_att: int = 1):
    """``check_params`` spec of capgen's attention (``dim`` = decoder width $n$, ``dimctx`` = $D$)."""
    spec = {"Wc_att": (dimctx, dimctx), "b_att": (dimctx,), "Wd_att": (dim, dimctx), "U_att": (dimctx, 1),
            "c_tt": (1,)}
    for lidx in range(1, n_layers_att):
        spec[f"W_att_{lidx}"] = (dimctx, dimctx)
        spec[f"b_att_{lidx}"] = (dimctx,)
    if selector:
        spec["W_sel"] = (dim, 1)
        spec["b_sel"] = (1,)
    return spec


def init_soft_attention_params(rng, dim: int, dimctx: int, *, selector: bool = False, n_layers_att: int = 1,
                               scale: float = 0.5) -> dict:
    """Random parameters in spec order (normal, std ``scale / sqrt(fan_in)``; biases small normal)."""
    out = {}
    for k, shp in soft_attention_param_spec(dim, dimctx, selector=selector, n_layers_att=n_layers_att).items():
        std = scale / np.sqrt(shp[0]) if len(shp) == 2 else 0.1
        out[k] = std * rng.standard_normal(shp)
    return out


def _layers_in(params) -> int:
    m = 1
    while isinstance(params, dict) and f"W_att_{m}" in params:
        m += 1
    return m


def soft_attention_forward(context, h, params, *, mask=None):
    r"""Show, Attend and Tell deterministic soft attention over all decoder steps at once.

    Parameters
    ----------
    context : array (B, L, D)
        Annotation vectors $a_i$.
    h : array (B, T, n)
        Decoder state $h_{t-1}$ before each step $t$ (capgen's ``h_``).
    params : dict
        ``soft_attention_param_spec`` keys; ``W_sel``/``b_sel`` turn the selector gate on,
        ``W_att_1 ...`` capgen's deep attention.
    mask : bool array (B, L), optional
        True = attend (an addition to capgen; fully masked rows give $z = 0$).

    Returns
    -------
    z, cache
        Context vectors ``(B, T, D)``; ``cache["alpha"]`` holds the weights ``(B, T, L)`` (the
        input of `doubly_stochastic_penalty_forward`).
    """
    a = as_float(context, "context", ndim=3)
    h = as_float(h, "h", ndim=3)
    if h.shape[0] != a.shape[0]:
        raise ValueError(f"h must have context's batch size {a.shape[0]} on axis 0; got shape {h.shape}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see soft_attention_param_spec); got {type(params).__name__}")
    selector = "W_sel" in params or "b_sel" in params
    spec = soft_attention_param_spec(h.shape[-1], a.shape[-1], selector=selector, n_layers_att=_layers_in(params))
    p = check_params(params, spec, where="soft_attention (arctic-captions lstm_cond_layer)")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = attend); got dtype {mask.dtype}")
        if mask.shape != a.shape[:2]:
            raise ValueError(f"mask must have shape (B, L) = {a.shape[:2]}; got {mask.shape}")
    dt = compute_dtype(a, h, *p.values())
    a, h, p = a.astype(dt, copy=False), h.astype(dt, copy=False), cast_all(dt, p)
    layers = [a @ p["Wc_att"] + p["b_att"]]
    for lidx in range(1, _layers_in(p)):
        layers.append(np.tanh(layers[-1] @ p[f"W_att_{lidx}"] + p[f"b_att_{lidx}"]))
    pstate = h @ p["Wd_att"]
    e, th = additive_scores(pstate, layers[-1], p["U_att"][:, 0], p["c_tt"][0])
    if mask is not None:
        e = np.where(mask[:, None, :], e, -np.inf)
    alpha, _ = softmax_lse(e, axis=-1)
    zc = alpha @ a
    beta = sigmoid(h @ p["W_sel"] + p["b_sel"]) if selector else None
    z = zc if beta is None else beta * zc
    cache = {"a": a, "h": h, "p": p, "layers": layers, "th": th, "alpha": alpha, "zc": zc, "beta": beta,
             "shape": z.shape}
    return z, cache


def soft_attention_backward(dout, cache, *, dalpha=None):
    """Gradient of :func:`soft_attention_forward`: ``context``, ``h`` and every parameter.

    ``dalpha`` (optional, shape (B, T, L)) is an extra upstream gradient on the attention weights
    ``cache["alpha"]`` (e.g. from `doubly_stochastic_penalty_backward`).
    """
    a, h, p, alpha = cache["a"], cache["h"], cache["p"], cache["alpha"]
    g = as_dout(dout, cache["shape"], a.dtype)
    grads = {}
    dh = np.zeros_like(h)
    if cache["beta"] is not None:
        beta = cache["beta"]
        dsel = np.sum(g * cache["zc"], axis=-1, keepdims=True) * beta * (1.0 - beta)
        grads["W_sel"] = h.reshape(-1, h.shape[-1]).T @ dsel.reshape(-1, 1)
        grads["b_sel"] = dsel.sum().reshape(1)
        dh += dsel * p["W_sel"][:, 0]
        g = g * beta
    dal = g @ np.swapaxes(a, -1, -2)
    if dalpha is not None:
        dal = dal + as_dout(dalpha, alpha.shape, a.dtype, name="dalpha")
    da = np.swapaxes(alpha, -1, -2) @ g
    de = softmax_vjp(alpha, dal)
    dstate, dc, du, dctt = additive_scores_vjp(de, cache["th"], p["U_att"][:, 0])
    grads["U_att"] = du[:, None]
    grads["c_tt"] = np.reshape(dctt, (1,))
    grads["Wd_att"] = h.reshape(-1, h.shape[-1]).T @ dstate.reshape(-1, dstate.shape[-1])
    dh += dstate @ p["Wd_att"].T
    layers = cache["layers"]
    for lidx in range(len(layers) - 1, 0, -1):
        dpre = dc * (1.0 - layers[lidx] ** 2)
        grads[f"W_att_{lidx}"] = layers[lidx - 1].reshape(-1, dpre.shape[-1]).T @ dpre.reshape(-1, dpre.shape[-1])
        grads[f"b_att_{lidx}"] = dpre.sum(axis=(0, 1))
        dc = dpre @ p[f"W_att_{lidx}"].T
    grads["Wc_att"] = a.reshape(-1, a.shape[-1]).T @ dc.reshape(-1, dc.shape[-1])
    grads["b_att"] = dc.sum(axis=(0, 1))
    da += dc @ p["Wc_att"].T
    return {"context": da, "h": dh, **{k: grads[k] for k in p}}


def soft_attention(context, h, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`soft_attention_forward`."""
    return soft_attention_forward(context, h, params, **config)[0]


def doubly_stochastic_penalty_forward(alpha, *, alpha_c: float = 1.0, normalize: str = "mean"):
    r"""Per-sample doubly-stochastic regulariser $\lambda'\sum_i(1-\sum_t\alpha_{ti})^2$ of weights
    ``alpha (B, T, L)``; ``normalize="mean"`` ($\lambda' = \lambda/L$, capgen: the batch sum of the
    result is capgen's ``alpha_reg``) or ``"sum"`` ($\lambda' = \lambda$, the paper). Returns ``((B,), cache)``."""
    alpha = as_float(alpha, "alpha", ndim=3)
    lam = check_positive(alpha_c, "alpha_c", allow_zero=True)
    check_choice(normalize, "normalize", PENALTY_NORMALIZATIONS)
    lam = lam / alpha.shape[-1] if normalize == "mean" else lam
    r = 1.0 - alpha.sum(axis=1)
    out = lam * np.sum(r * r, axis=-1)
    return out, {"r": r, "lam": lam, "shape": alpha.shape}


def doubly_stochastic_penalty_backward(dout, cache):
    """Gradient of :func:`doubly_stochastic_penalty_forward`: ``{"alpha"}`` (the same for every step)."""
    r = cache["r"]
    g = as_dout(dout, r.shape[:1], r.dtype)
    d = (-2.0 * cache["lam"]) * g[:, None] * r
    return {"alpha": np.broadcast_to(d[:, None, :], cache["shape"]).copy()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, selector=None, n_layers_att=None):
    if size == "tiny":
        b, t, l, n, d = 2, 2, 3, 2, 3
    else:
        b, t, l, n, d = 2, int(rng.integers(3, 6)), int(rng.integers(4, 9)), 5, 4
    selector = bool(rng.random() < 0.5) if selector is None else selector
    m = (1 if size == "tiny" else int(rng.integers(1, 3))) if n_layers_att is None else n_layers_att
    p = init_soft_attention_params(rng, n, d, selector=selector, n_layers_att=m, scale=1.5)
    cfg = {}
    if size == "small" and rng.random() < 0.5:
        keep = rng.random((b, l)) < 0.8
        keep[:, 0] = True
        cfg["mask"] = keep
    return Sample(inputs={"context": rng.standard_normal((b, l, d)), "h": rng.standard_normal((b, t, n))},
                  params=p, config=cfg)


def _reference(context, h, params, *, mask=None):
    # The capgen step written per (sample, step, location): score, softmax, weighted sum, gate.
    p = params
    b, l, d = context.shape
    t = h.shape[1]
    z = np.zeros((b, t, d))
    for bb in range(b):
        c = context[bb] @ p["Wc_att"] + p["b_att"]
        for lidx in range(1, _layers_in(p)):
            c = np.tanh(c @ p[f"W_att_{lidx}"] + p[f"b_att_{lidx}"])
        for tt in range(t):
            s = h[bb, tt] @ p["Wd_att"]
            e = np.array([np.tanh(c[i] + s) @ p["U_att"][:, 0] + p["c_tt"][0] for i in range(l)])
            keep = np.ones(l, bool) if mask is None else mask[bb]
            w = np.where(keep, np.exp(e - e[keep].max()), 0.0)
            zz = (w / w.sum()) @ context[bb]
            if "W_sel" in p:
                zz = zz / (1.0 + np.exp(-(h[bb, tt] @ p["W_sel"][:, 0] + p["b_sel"][0])))
            z[bb, tt] = zz
    return z


def _check_regulariser_zero_at_unit_mass(rng):
    # Columns that each sum to one over the steps (a doubly stochastic T x T matrix when T = L) give 0;
    # perturbing one column's mass makes it positive.
    t = 4
    perm = np.stack([np.eye(t)[rng.permutation(t)] for _ in range(2)])
    mix = 0.5 * perm + 0.5 * np.stack([np.eye(t)[rng.permutation(t)] for _ in range(2)])
    out, _ = doubly_stochastic_penalty_forward(mix, alpha_c=3.0, normalize="sum")
    err = float(np.abs(out).max())
    assert err < 1e-15, f"penalty of a doubly stochastic matrix is {err:.2e}, not 0"
    bad = mix.copy()
    bad[:, 0, 0] += 0.1
    pos, _ = doubly_stochastic_penalty_forward(bad, alpha_c=3.0, normalize="sum")
    assert np.allclose(pos, 3.0 * 0.01), pos
    return err


def _check_regulariser_matches_capgen_reduction(rng):
    # capgen: alpha_c * ((1 - alphas.sum(0))**2).sum(0).mean() on alphas (T, B, L).
    al = rng.dirichlet(np.ones(5), size=(3, 4))
    out, _ = doubly_stochastic_penalty_forward(al, alpha_c=0.7, normalize="mean")
    at = np.transpose(al, (1, 0, 2))
    want = 0.7 * ((1.0 - at.sum(0)) ** 2).sum(0).mean()
    err = abs(float(out.sum()) - float(want))
    assert err < 1e-12, err
    return err


def _check_loss_with_regulariser_gradcheck(rng):
    # FD of <G, z> + sum_b penalty(alpha) through every input and parameter: dalpha carries the
    # regulariser's coupling of all steps into the layer's backward.
    from ...testing import gradcheck
    s = _sample(rng, "tiny", selector=True, n_layers_att=2)
    gz = rng.standard_normal((2, 2, 3))

    def fwd(context, h, params):
        z, c = soft_attention_forward(context, h, params)
        pen, cp = doubly_stochastic_penalty_forward(c["alpha"], alpha_c=0.8)
        return np.array([np.sum(gz * z) + pen.sum()]), (c, cp)

    def bwd(dout, caches):
        c, cp = caches
        da = doubly_stochastic_penalty_backward(np.full(2, dout[0]), cp)["alpha"]
        return soft_attention_backward(dout[0] * gz, c, dalpha=da)

    return gradcheck(fwd, bwd, s).max_rel


def _check_uniform_when_score_is_flat(rng):
    # U_att = 0 makes every score equal: alpha is uniform and z the mean annotation (times the gate).
    s = _sample(rng, "small", selector=False)
    p = dict(s.params, U_att=np.zeros_like(s.params["U_att"]))
    z, c = soft_attention_forward(s.inputs["context"], s.inputs["h"], p)
    want = np.broadcast_to(s.inputs["context"].mean(axis=1, keepdims=True), z.shape)
    err = float(np.abs(z - want).max())
    assert err < 1e-12, f"flat scores do not give the mean annotation ({err:.2e})"
    return err


register(
    Mechanism(
        slug="additive_attention_bahdanau", family="1-softmax", tier="T2",
        title="Additive (MLP-score) soft attention; Show, Attend and Tell (with selector and doubly-stochastic regulariser)",
        paper="Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel, Bengio, Show, Attend and Tell: Neural Image "
              "Caption Generation with Visual Attention, ICML 2015, arXiv 1502.03044; score of Bahdanau, Cho, "
              "Bengio, ICLR 2015, arXiv 1409.0473",
        forward=soft_attention_forward, backward=soft_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#additive-soft-attention-show-attend-and-tell",
        checks={"regulariser_zero_at_unit_mass": _check_regulariser_zero_at_unit_mass,
                "regulariser_matches_capgen_reduction": _check_regulariser_matches_capgen_reduction,
                "loss_with_regulariser_gradcheck": _check_loss_with_regulariser_gradcheck,
                "uniform_when_score_is_flat": _check_uniform_when_score_is_flat},
    ),
)
