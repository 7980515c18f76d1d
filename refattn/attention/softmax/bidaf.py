r"""Bi-directional attention flow (BiDAF): the trilinear similarity, context-to-query and
query-to-context attention, and the query-aware context representation $G$.

Paper: Seo, Kembhavi, Farhadi, Hajishirzi, "Bidirectional Attention Flow for Machine Comprehension",
ICLR 2017, arXiv 1611.01603. Upstream: allenai/bi-att-flow ``basic/model.py``
@49004549e9a88b78c359b31481afa7792dbb3f4a (``bi_attention``, ``attention_layer``) with
``my/tensorflow/nn.py`` (``get_logits(func="tri_linear")``, ``linear_logits``, ``softsel``) and
``my/tensorflow/general.py`` (``exp_mask``, ``VERY_NEGATIVE_NUMBER = -1e30``); defaults from
``basic/cli.py`` (``logit_func="tri_linear"``, ``c2q_att=q2c_att=True``).

Forward
-------
Context $h_t\in\mathbb R^{d}$ ($t = 1..T$), query $u_j\in\mathbb R^{d}$ ($j = 1..J$; $d$ is the
$2d$ of the paper's bi-LSTM outputs):

$$S_{tj} = w^\top[h_t;\,u_j;\,h_t\circ u_j] + b = w_h^\top h_t + w_u^\top u_j + w_{hu}^\top(h_t\circ u_j) + b,$$
$$a_t = \mathrm{softmax}_j(S_{t:}),\quad \tilde u_t = \sum_j a_{tj}u_j\ \ \text{(C2Q)},\qquad
b = \mathrm{softmax}_t\big(\max_j S_{tj}\big),\quad \tilde h = \sum_t b_th_t\ \ \text{(Q2C, tiled over } t),$$
$$G_t = [h_t;\ \tilde u_t;\ h_t\circ\tilde u_t;\ h_t\circ\tilde h]\in\mathbb R^{4d}.$$

$w = [w_h; w_u; w_{hu}]$ is TensorFlow's ``_linear`` kernel of scope ``u_logits/first`` (stored
``(3d, 1)``, TF's ``(in, out)``), here ``"u_logits.first.Matrix"``, and $b$ its ``"u_logits.first.Bias"``.
$b$ cancels in both softmaxes (its gradient is exactly zero), as upstream.
``c2q_att=False`` replaces $\tilde u_t$ by the query mean $\frac1J\sum_ju_j$ (unmasked, as
``tf.reduce_mean``); ``q2c_att=False`` drops the last block ($G\in\mathbb R^{3d}$). Upstream's context is
``(N, M, JX, d)`` with $M$ sentences and the Q2C softmax per sentence: fold $M$ into the batch
(repeating the query) to get that.

Masks: ``h_mask (B, T)`` and ``u_mask (B, J)``, True = valid, mask the logits of every pair
with an invalid member to ``mask_value`` ($-10^{30}$, upstream's ``VERY_NEGATIVE_NUMBER``).
Upstream *adds* the value (``exp_mask``); refattn *replaces* the logit. The forward is the same
in float32 and float64 (a logit of size $<10^{13}$ is absorbed by $-10^{30}$), and so is the
backward on every valid context position; on a padded context position (all $J$ logits masked)
upstream's autograd sends a gradient through the absorbed logits, refattn sends none (its
forward does not depend on them).

Backward
--------
$dh = dG_1 + dG_3\circ\tilde u + dG_4\circ\tilde h$, $d\tilde u = dG_2 + dG_3\circ h$,
$d\tilde h = \sum_t dG_{4,t}\circ h_t$. Q2C: $dh_t \mathrel{+}= b_t\,d\tilde h$, $db_t = h_t\cdot d\tilde h$,
$dm = b\odot(db - \sum b\,db)$, and the max routes $dm_t$ to the maximising $j$ (the selection
is held fixed; samplers draw well separated maxima). C2Q: $du \mathrel{+}= a^\top d\tilde u$,
$dS \mathrel{+}= a\odot(da - \sum_j a\,da)$ with $da = d\tilde u\,u^\top$. Trilinear:
$dw_h = \sum_t(\sum_jdS_{tj})h_t$, $dw_u = \sum_j(\sum_tdS_{tj})u_j$,
$dw_{hu} = \sum_th_t\circ(dS\,u)_t$, $db = \sum dS$, $dh \mathrel{+}= (dS\mathbf 1)w_h^\top + (dS\,u)\circ w_{hu}$,
$du \mathrel{+}= (dS^\top\mathbf 1)w_u^\top + (dS^\top h)\circ w_{hu}$.

Agreement with upstream (measured)
---------------------------------
bi-att-flow is TensorFlow 0.11 and does not run here: ``attention_layer``/``bi_attention`` with
``tri_linear`` logits and ``exp_mask`` were transcribed into a float64 torch scratch script
(B=3, T=6, J=5, d=4) and compared, output and the gradients of $h$, $u$, ``Matrix``, ``Bias``:
worst abs $5.3\cdot10^{-15}$ / rel $5.5\cdot10^{-16}$ (no masks), $7.1\cdot10^{-15}$ / $7.3\cdot10^{-16}$
(query mask), $6.2\cdot10^{-15}$ (``c2q_att=False``), $8.9\cdot10^{-15}$ (``q2c_att=False``). With a
padded *context* position the forward agrees but upstream's additive mask gives autograd gradients
through the absorbed logits of that row (measured difference up to 7.6 in ``Matrix``); with a
replacing fill in the transcription the two agree to $6.2\cdot10^{-15}$ (see Masks above).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, compute_dtype
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = [
    "bidaf_param_spec",
    "init_bidaf_params",
    "bidaf_similarity",
    "bidaf_attention_forward",
    "bidaf_attention_backward",
    "bidaf_attention",
]

VERY_NEGATIVE_NUMBER = -1e30


def bidaf_param_spec(d: int) -> dict:
    """``check_params`` spec: the tri-linear ``u_logits/first`` kernel ``(3d, 1)`` and bias ``(1,)``."""
    return {"u_logits.first.Matrix": (3 * d, 1), "u_logits.first.Bias": (1,)}


def init_bidaf_params(rng, d: int) -> dict:
    """Random parameters (uniform kernel of TF's default scale, small bias)."""
    bound = np.sqrt(6.0 / (3 * d + 1))
    return {"u_logits.first.Matrix": rng.uniform(-bound, bound, (3 * d, 1)),
            "u_logits.first.Bias": 0.1 * rng.standard_normal(1)}


def bidaf_similarity(h: np.ndarray, u: np.ndarray, w: np.ndarray, bias) -> np.ndarray:
    r"""Unvalidated trilinear similarity $S_{tj} = w_h\cdot h_t + w_u\cdot u_j + w_{hu}\cdot(h_t\circ u_j) + b$
    for ``h (..., T, d)``, ``u (..., J, d)``, ``w (3d,)``: ``(..., T, J)`` without the ``(T, J, 3d)``
    concatenation."""
    d = h.shape[-1]
    wh, wu, whu = w[:d], w[d:2 * d], w[2 * d:]
    return (h @ wh)[..., :, None] + (u @ wu)[..., None, :] + (h * whu) @ np.swapaxes(u, -1, -2) + bias


def _check_mask(mask, name, shape):
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"{name} must be a boolean array (True = valid); got dtype {m.dtype}")
    if m.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {m.shape}")
    return m


def bidaf_attention_forward(h, u, params, *, h_mask=None, u_mask=None, c2q_att: bool = True,
                            q2c_att: bool = True, mask_value: float = VERY_NEGATIVE_NUMBER):
    r"""BiDAF's attention flow layer (upstream ``attention_layer``; see the module docstring).

    Parameters
    ----------
    h : array (B, T, d)
        Context encoding.
    u : array (B, J, d)
        Query encoding.
    params : dict
        ``"u_logits.first.Matrix" (3d, 1)``, ``"u_logits.first.Bias" (1,)``.
    h_mask, u_mask : bool arrays (B, T), (B, J), optional
        True = valid token.
    c2q_att, q2c_att : bool
        Upstream's switches (both True by default).
    mask_value : float
        Logit of a masked pair (upstream $-10^{30}$).

    Returns
    -------
    G, cache
        ``(B, T, 4d)`` (``(B, T, 3d)`` with ``q2c_att=False``).
    """
    h = as_float(h, "h", ndim=3)
    u = as_float(u, "u", ndim=3)
    if u.shape[0] != h.shape[0] or u.shape[2] != h.shape[2]:
        raise ValueError(f"u must have shape (B, J, d) with h's B={h.shape[0]} and d={h.shape[2]}; got {u.shape}")
    for flag, name in ((c2q_att, "c2q_att"), (q2c_att, "q2c_att")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    mask_value = float(mask_value)
    b, t, d = h.shape
    h_mask = _check_mask(h_mask, "h_mask", (b, t))
    u_mask = _check_mask(u_mask, "u_mask", (b, u.shape[1]))
    p = check_params(params, bidaf_param_spec(d), where="bidaf_attention (bi-att-flow bi_attention)")
    dt = compute_dtype(h, u, *p.values())
    h, u, p = h.astype(dt, copy=False), u.astype(dt, copy=False), cast_all(dt, p)
    cache = {"h": h, "u": u, "p": p, "c2q": bool(c2q_att), "q2c": bool(q2c_att)}
    if c2q_att or q2c_att:
        s = bidaf_similarity(h, u, p["u_logits.first.Matrix"][:, 0], p["u_logits.first.Bias"][0])
        if h_mask is not None or u_mask is not None:
            hm = np.ones((b, t), bool) if h_mask is None else h_mask
            um = np.ones((b, u.shape[1]), bool) if u_mask is None else u_mask
            cache["keep"] = hm[:, :, None] & um[:, None, :]
            s = np.where(cache["keep"], s, mask_value)
        cache["s"] = s
    if c2q_att:
        a, _ = softmax_lse(s, axis=-1)
        ut = a @ u
        cache["a"] = a
    else:
        ut = np.broadcast_to(u.mean(axis=1, keepdims=True), h.shape)
    parts = [h, ut, h * ut]
    if q2c_att:
        jmax = np.argmax(s, axis=-1)
        m = np.take_along_axis(s, jmax[..., None], axis=-1)[..., 0]
        bw, _ = softmax_lse(m, axis=-1)
        ht = np.einsum("bt,btd->bd", bw, h)
        parts.append(h * ht[:, None, :])
        cache.update(jmax=jmax, bw=bw, ht=ht)
    cache["ut"] = ut
    out = np.concatenate(parts, axis=-1)
    cache["shape"] = out.shape
    return out, cache


def bidaf_attention_backward(dout, cache):
    """Gradient of :func:`bidaf_attention_forward`: ``h``, ``u`` and both parameters (the max over
    the query held at its argmax)."""
    h, u, p, ut = cache["h"], cache["u"], cache["p"], cache["ut"]
    g = as_dout(dout, cache["shape"], h.dtype)
    d, jn = h.shape[-1], u.shape[1]
    dh = g[..., :d] + g[..., 2 * d:3 * d] * ut
    dut = g[..., d:2 * d] + g[..., 2 * d:3 * d] * h
    du = np.zeros_like(u)
    ds = None
    if cache["q2c"]:
        g4 = g[..., 3 * d:]
        dh = dh + g4 * cache["ht"][:, None, :]
        dht = np.sum(g4 * h, axis=1)                     # (B, d)
        bw = cache["bw"]
        dh = dh + bw[..., None] * dht[:, None, :]
        dm = softmax_vjp(bw, np.einsum("btd,bd->bt", h, dht))
        ds = np.zeros_like(cache["s"])
        np.put_along_axis(ds, cache["jmax"][..., None], dm[..., None], axis=-1)
    if cache["c2q"]:
        a = cache["a"]
        du = du + np.swapaxes(a, -1, -2) @ dut
        dsa = softmax_vjp(a, dut @ np.swapaxes(u, -1, -2))
        ds = dsa if ds is None else ds + dsa
    else:
        du = du + np.broadcast_to(dut.sum(axis=1, keepdims=True) / jn, u.shape)
    grads = {}
    if ds is not None:
        if "keep" in cache:
            ds = np.where(cache["keep"], ds, 0.0)
        w = p["u_logits.first.Matrix"][:, 0]
        wh, wu, whu = w[:d], w[d:2 * d], w[2 * d:]
        rs, cs = ds.sum(axis=-1), ds.sum(axis=-2)        # (B, T), (B, J)
        dsu, dsh = ds @ u, np.swapaxes(ds, -1, -2) @ h   # (B, T, d), (B, J, d)
        gw = np.concatenate([np.einsum("bt,btd->d", rs, h), np.einsum("bj,bjd->d", cs, u),
                             np.sum(h * dsu, axis=(0, 1))])
        grads["u_logits.first.Matrix"] = gw[:, None]
        grads["u_logits.first.Bias"] = np.reshape(ds.sum(), (1,))
        dh = dh + rs[..., None] * wh + dsu * whu
        du = du + cs[..., None] * wu + dsh * whu
    else:
        grads = {k: np.zeros_like(v) for k, v in p.items()}
    return {"h": dh, "u": du, **grads}


def bidaf_attention(h, u, params, **config) -> np.ndarray:
    """Convenience wrapper: the output $G$ of :func:`bidaf_attention_forward`."""
    return bidaf_attention_forward(h, u, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _separated(rng, b, t, j, d, p, gap, u_mask=None):
    # Redraw until every row max of S over the valid query words is ahead of the runner-up by
    # `gap` (the argmax is then stable under the finite-difference steps).
    for _ in range(200):
        h, u = rng.standard_normal((b, t, d)), rng.standard_normal((b, j, d))
        s = bidaf_similarity(h, u, p["u_logits.first.Matrix"][:, 0], 0.0)
        if u_mask is not None:
            s = np.where(u_mask[:, None, :], s, -np.inf)
        s = np.sort(s, axis=-1)
        if j == 1 or np.min(s[..., -1] - s[..., -2]) > gap:
            return h, u
    raise AssertionError("could not draw tie-free BiDAF inputs")


def _sample(rng, size):
    b, t, j, d = (2, 3, 3, 2) if size == "tiny" else (2, int(rng.integers(4, 8)), int(rng.integers(3, 6)), 4)
    p = init_bidaf_params(rng, d)
    p["u_logits.first.Matrix"] = 2.0 * p["u_logits.first.Matrix"]
    cfg = {}
    if size == "small" and rng.random() < 0.5:
        cfg["u_mask"] = np.arange(j)[None, :] < np.array([j, j - 1])[:, None]
        cfg["h_mask"] = np.arange(t)[None, :] < np.array([t, t - 1])[:, None]
    h, u = _separated(rng, b, t, j, d, p, 0.05, cfg.get("u_mask"))
    return Sample(inputs={"h": h, "u": u}, params=p, config=cfg)


def _reference(h, u, params, *, h_mask=None, u_mask=None, c2q_att=True, q2c_att=True,
               mask_value=VERY_NEGATIVE_NUMBER):
    # Upstream's tile-and-concatenate form: S from [h; u; h*u] (T, J, 3d) @ w, explicit loops.
    b, t, d = h.shape
    jn = u.shape[1]
    w, bias = params["u_logits.first.Matrix"][:, 0], params["u_logits.first.Bias"][0]
    out = []
    for bb in range(b):
        s = np.empty((t, jn))
        for i in range(t):
            for j in range(jn):
                valid = (h_mask is None or h_mask[bb, i]) and (u_mask is None or u_mask[bb, j])
                s[i, j] = np.concatenate([h[bb, i], u[bb, j], h[bb, i] * u[bb, j]]) @ w + bias if valid else mask_value
        e = np.exp(s - s.max(axis=1, keepdims=True))
        ut = (e / e.sum(axis=1, keepdims=True)) @ u[bb] if c2q_att else np.tile(u[bb].mean(0), (t, 1))
        rows = [np.concatenate([h[bb, i], ut[i], h[bb, i] * ut[i]]) for i in range(t)]
        if q2c_att:
            m = np.array([max(s[i]) for i in range(t)])
            bw = np.exp(m - m.max())
            ht = (bw / bw.sum()) @ h[bb]
            rows = [np.concatenate([r, h[bb, i] * ht]) for i, r in enumerate(rows)]
        out.append(np.stack(rows))
    return np.stack(out)


def _check_argmax_selection_brute_force(rng):
    # The Q2C max picks, per context word, the query word of largest similarity: brute force over pairs.
    s = _sample(rng, "small")
    _, c = bidaf_attention_forward(s.inputs["h"], s.inputs["u"], s.params)
    h, u, w = s.inputs["h"], s.inputs["u"], s.params["u_logits.first.Matrix"][:, 0]
    bad = 0
    for bb in range(h.shape[0]):
        for i in range(h.shape[1]):
            vals = [np.concatenate([h[bb, i], u[bb, j], h[bb, i] * u[bb, j]]) @ w for j in range(u.shape[1])]
            bad += int(np.argmax(vals) != c["jmax"][bb, i])
    assert bad == 0, f"{bad} argmax selections differ from the brute-force search"
    return 0.0


def _check_bias_gradient_is_zero(rng):
    # The bias shifts every logit of a row (C2Q) and every row max (Q2C): both softmaxes cancel it.
    s = _sample(rng, "small")
    out, c = bidaf_attention_forward(s.inputs["h"], s.inputs["u"], s.params)
    g = bidaf_attention_backward(rng.standard_normal(out.shape), c)
    err = float(np.abs(g["u_logits.first.Bias"]).max())
    p2 = dict(s.params, **{"u_logits.first.Bias": s.params["u_logits.first.Bias"] + 3.0})
    err = max(err, float(np.abs(bidaf_attention(s.inputs["h"], s.inputs["u"], p2) - out).max()))
    assert err < 1e-12, err
    return err


def _check_dot_similarity_is_sdpa(rng):
    # w = [0; 0; 1] makes S = h u^T: C2Q is then SDPA with scale 1 and the query as keys and values.
    from .sdpa import sdpa
    s = _sample(rng, "small")
    h, u = s.inputs["h"], s.inputs["u"]
    d = h.shape[-1]
    p = {"u_logits.first.Matrix": np.concatenate([np.zeros(2 * d), np.ones(d)])[:, None],
         "u_logits.first.Bias": np.zeros(1)}
    g = bidaf_attention(h, u, p, q2c_att=False)
    want = sdpa(h[:, None], u[:, None], u[:, None], scale=1.0)[:, 0]
    err = float(np.abs(g[..., d:2 * d] - want).max())
    assert err < 1e-12, err
    return err


def _check_switches_gradcheck(rng):
    # Upstream's c2q_att / q2c_att switches off: the query mean replaces C2Q, G loses its Q2C block.
    from ...testing import gradcheck
    worst = 0.0
    for c2q, q2c in ((False, True), (True, False), (False, False)):
        s = _sample(rng, "tiny")
        s.config.update(c2q_att=c2q, q2c_att=q2c)
        worst = max(worst, gradcheck(bidaf_attention_forward, bidaf_attention_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="bidaf_attention_flow", family="1-softmax", tier="T2",
        title="Bi-directional attention flow (trilinear similarity, C2Q and Q2C attention)",
        paper="Seo, Kembhavi, Farhadi, Hajishirzi, Bidirectional Attention Flow for Machine Comprehension, "
              "ICLR 2017, arXiv 1611.01603",
        forward=bidaf_attention_forward, backward=bidaf_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#bidirectional-attention-flow-bidaf",
        checks={"argmax_selection_brute_force": _check_argmax_selection_brute_force,
                "bias_gradient_is_zero": _check_bias_gradient_is_zero,
                "dot_similarity_is_sdpa": _check_dot_similarity_is_sdpa,
                "switches_gradcheck": _check_switches_gradcheck},
    ),
)
