r"""CoCA: Collinear Constrained Attention (the Llama attention layer with ``t_proj`` instead of ``k_proj``).

Paper: Zhu, Ye, Jiang, Xue, Zhang, Wu, Li, "CoCA: Fusing Position Embedding with Collinear
Constrained Attention in Transformers for Long Context Window Extending", ACL 2024, arXiv 2309.08646.
Upstream: codefuse-ai/Collinear-Constrained-Attention ``model/llama/modeling_llama.py``
@79bee172680e8ac8894fb73445eaea2fdf64f1d7 (``LlamaAttention``; the file is unchanged up to the
newest commit aae1cfdd3ea8ce04d86db88e62fb3a5b7c22aa34).

The layer
---------
Token-major input $x$ ``(B, N, C)``, $H$ query heads of width $d$ ($d$ even), $H_{kv}$ key/value
heads (GQA: head $h$ uses kv head $\lfloor h/(H/H_{kv})\rfloor$, ``repeat_kv``), no biases
upstream (optional here). With $h = d/2$ and the Llama rotate-half pairing of channel $m$ with
$m + h$ (`refattn.nn.rope`, ``interleaved=False``), angles $\phi_{i,m} = p_i\theta_m$,
$\theta_m = \text{base}^{-2m/d}$ at the position ids $p$:

$$q = xW_q,\qquad \tau = \mathrm{ReLU}\big(\tfrac12(t_{:,:h} + t_{:,h:})\big),\ t = xW_t,\qquad v = xW_v,$$

so $\tau \ge 0$ holds one non-negative magnitude per rotary plane $m$ (``t_states`` averaged over
its two halves, ReLU'd, then duplicated: $\bar t = [\tau, \tau]$). Two score definitions
(``coca_mode``), both times $s = d^{-1/2}$:

* ``"code"`` (default; the official three-operand einsum
  ``contract('bpnd,bpsd,bpnd->bpns', q, R_j t, R_i q)``):

  $$S_{ij} = s\sum_{c=1}^{d} q_{ic}\,(R_i q_i)_c\,(R_j\bar t_j)_c = s\,u_i\cdot(R_j\bar t_j),\qquad u_i = q_i\odot R_iq_i .$$

* ``"closed_form"`` (the paper's construction): per plane the key is collinear with the query,
  $k^{(m)}_{ij} = \tau_{jm}\,q^{(m)}_i$ (a 2-vector), so with RoPE
  $(R_iq_i^{(m)})\cdot(R_jk^{(m)}_{ij}) = \tau_{jm}\lVert q^{(m)}_i\rVert^2\cos((p_i - p_j)\theta_m)$ and

  $$S_{ij} = s\sum_{m<h} a_{im}\,\tau_{jm}\cos\big((p_i-p_j)\theta_m\big),\qquad a_{im} = q_{im}^2 + q_{i,m+h}^2 .$$

**The two disagree** (the catalogue's unresolved conflict, confirmed here): per plane with
$q^{(m)}_i = (\alpha, \beta)$, $c_\cdot = \cos(p_\cdot\theta_m)$, $s_\cdot = \sin(p_\cdot\theta_m)$,

$$S^{\text{code}}_{ij} - S^{\text{closed}}_{ij} = s\sum_m\tau_{jm}\big[(\beta^2-\alpha^2)\,c_i s_j - (\alpha-\beta)^2 s_i s_j\big],$$

zero only when every $\sin(p\theta_m)$ vanishes (all positions 0). ``"code"`` is the default
because it is what the released model computes.

Both modes are one matrix product of two ``(N, d)`` factors, so the layer calls the attention core
(`refattn.attention.softmax.attention_core_forward`) on $(\tilde q, \tilde k, v)$ with
$\tilde q\tilde k^\top = S/s$, memory $O(N^2)$ and never an $N\times N\times d$ tensor:
code: $\tilde q = u$, $\tilde k = R\bar t$; closed form (expanding the cosine):
$\tilde q_i = [a_i\odot\cos\phi_i,\ a_i\odot\sin\phi_i]$, $\tilde k_j = [\tau_j\odot\cos\phi_j,\ \tau_j\odot\sin\phi_j]$.
Then softmax with the causal mask (upstream's ``LlamaModel`` mask; ``is_causal=True`` default) or
``attn_mask``, $O = PV$, heads merged, $y = OW_o$.

Backward (derivation)
---------------------
The attention VJP (`refattn.attention.softmax.attention_core_backward`) gives $d\tilde q, d\tilde k, dv$
(GQA-reduced). Code mode: $u = q\odot Rq$ is bilinear in $q$, so $q$ receives two terms,
$dq = du\odot Rq + R^\top(du\odot q)$ with $R^\top = R(-\phi)$ (RoPE is orthogonal); $d\bar t = R^\top d\tilde k$
and the duplication sums the halves, $d\tau = d\bar t_{:h} + d\bar t_{h:}$. Closed form:
$da = d\tilde q_{:h}\odot\cos\phi + d\tilde q_{h:}\odot\sin\phi$, $dq_{:h} = 2q_{:h}\odot da$, $dq_{h:} = 2q_{h:}\odot da$;
$d\tau = d\tilde k_{:h}\odot\cos\phi + d\tilde k_{h:}\odot\sin\phi$. Then through the ReLU
(kink at 0: the samplers keep $|\frac12(t_{:h}+t_{h:})|$ away from 0), $dt = \tfrac12[d\tau^{+}, d\tau^{+}]$ with
$d\tau^{+} = d\tau\odot[\tfrac12(t_{:h}+t_{h:}) > 0]$, and the linear VJPs
($dW = x^\top d(\cdot)$, $dx = \sum d(\cdot)W^\top$).

Conventions
-----------
``coca_mode`` (``"code"``); ``is_causal`` (True, Llama decoder); ``attn_mask`` (bool or additive,
upstream's additive ``(B, 1, N, M)`` mask uses ``finfo.min``); ``position_ids`` (default
``arange(N)``, ``(N,)`` or ``(B, N)``, real values allowed); ``rope_theta`` (10000; upstream's
``LlamaRotaryEmbedding`` builds ``inv_freq`` in float32, refattn in float64: a $\sim10^{-7}$
relative difference in the angles); ``scale`` ($d^{-1/2}$). Upstream's linear/dynamic-NTK rope
scaling changes only the angles: pass scaled ``position_ids`` (linear) or a larger ``rope_theta``.
Parameters as the upstream ``state_dict`` (weights ``(in, out)`` = torch ``weight.T``):
``q_proj.weight (C, H d)``, ``t_proj.weight (C, H_kv d)``, ``v_proj.weight (C, H_kv d)``,
``o_proj.weight (H d, C)``, optional ``*.bias``.

Agreement with upstream: see ``docs/softmax/positional-encodings.md#coca-collinear-constrained-attention``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ...nn.rope import apply_rope, rope_angles
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "COCA_MODES",
    "coca_param_spec",
    "init_coca_params",
    "coca_key_magnitudes",
    "coca_scores",
    "coca_position_angles",
    "coca_attention_forward",
    "coca_attention_backward",
    "coca_attention",
]

COCA_MODES = ("code", "closed_form")
_PROJ = ("q_proj", "t_proj", "v_proj", "o_proj")


def coca_param_spec(hidden_size: int, num_heads: int, num_key_value_heads=None):
    """``(spec, optional)`` of the layer's parameters (upstream ``LlamaAttention`` names, weights ``(in, out)``)."""
    c, h = check_size(hidden_size, "hidden_size"), check_size(num_heads, "num_heads")
    hkv = h if num_key_value_heads is None else check_size(num_key_value_heads, "num_key_value_heads")
    if c % h or (c // h) % 2:
        raise ValueError(f"hidden_size ({c}) must be num_heads ({h}) times an even head dim")
    if h % hkv:
        raise ValueError(f"num_heads ({h}) must be a multiple of num_key_value_heads ({hkv})")
    d = c // h
    spec = {}
    for name, n_in, n_out in (("q_proj", c, h * d), ("t_proj", c, hkv * d), ("v_proj", c, hkv * d),
                              ("o_proj", h * d, c)):
        spec.update(linear_prefixed_spec(name, n_in, n_out, bias=True))
    return spec, tuple(f"{n}.bias" for n in _PROJ)


def init_coca_params(rng, hidden_size: int, num_heads: int, num_key_value_heads=None, *, bias: bool = False) -> dict:
    """PyTorch-default ``nn.Linear`` initialisation of the four projections (biases only with ``bias=True``)."""
    spec, _ = coca_param_spec(hidden_size, num_heads, num_key_value_heads)
    p = {}
    for name in _PROJ:
        n_in, n_out = spec[f"{name}.weight"]
        p.update(init_linear_prefixed(rng, n_in, n_out, name, bias=bias))
    return p


def coca_key_magnitudes(t_states: np.ndarray) -> np.ndarray:
    r"""$\tau = \mathrm{ReLU}(\tfrac12(t_{:,:h} + t_{:,h:}))$ ``(..., d/2)``, the non-negative per-plane key
    magnitudes from ``t_proj`` outputs ``(..., d)`` (unvalidated helper)."""
    h = t_states.shape[-1] // 2
    return np.maximum(0.5 * (t_states[..., :h] + t_states[..., h:]), 0.0)


def coca_position_angles(position_ids, n: int, head_dim: int, rope_theta: float = 10000.0) -> np.ndarray:
    r"""Angles $p\,\theta_m$ ``(N, d/2)`` or ``(B, 1, N, d/2)`` (for ``(B, N)`` position ids), float64."""
    pos = np.arange(n, dtype=np.float64) if position_ids is None else np.asarray(position_ids, np.float64)
    ang = rope_angles(pos, head_dim, base=rope_theta)
    return ang[:, None] if ang.ndim == 3 else ang


def coca_scores(q, tau, cos, sin, coca_mode: str = "code"):
    r"""Unscaled scores $S/s$ ``(..., N, M)`` from queries ``(..., N, d)``, magnitudes $\tau$ ``(..., M, d/2)``
    and the ``cos``/``sin`` tables of the angles (unvalidated; the layer never forms them this way)."""
    qt, kt = _factors(q, tau, cos, sin, coca_mode)[:2]
    return qt @ np.swapaxes(kt, -1, -2)


def _factors(q, tau, cos, sin, mode):
    # (q~, k~) with q~ k~^T = S / s, plus what the backward needs
    if mode == "code":
        qr = apply_rope(q, cos, sin)
        tr = apply_rope(np.concatenate([tau, tau], axis=-1), cos, sin)
        return q * qr, tr, qr
    h = q.shape[-1] // 2
    a = q[..., :h] ** 2 + q[..., h:] ** 2
    return (np.concatenate([a * cos, a * sin], axis=-1), np.concatenate([tau * cos, tau * sin], axis=-1), None)


def _validate_positions(position_ids, b, n):
    if position_ids is None:
        return None
    pos = np.asarray(position_ids)
    if pos.dtype.kind not in "iuf":
        raise TypeError(f"position_ids must be an integer or real array; got dtype {pos.dtype}")
    if pos.shape not in ((n,), (b, n)):
        raise ValueError(f"position_ids must have shape (N,) = ({n},) or (B, N) = ({b}, {n}); got {pos.shape}")
    if not np.isfinite(pos).all():
        raise ValueError("position_ids contains NaN or infinite values")
    return pos


def coca_attention_forward(x, params, *, num_heads: int, num_key_value_heads=None, coca_mode: str = "code",
                           position_ids=None, rope_theta: float = 10000.0, is_causal: bool = True, attn_mask=None,
                           scale=None):
    r"""CoCA self-attention layer (upstream ``LlamaAttention`` with ``t_proj``; see the module docstring).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``q_proj.weight (C, H d)``, ``t_proj.weight (C, H_kv d)``, ``v_proj.weight (C, H_kv d)``,
        ``o_proj.weight (H d, C)`` (torch ``weight.T``), optional ``*.bias``.
    num_heads, num_key_value_heads : int
        ``H`` and ``H_kv`` (default ``H``); the head dim ``d = C / H`` must be even.
    coca_mode : {"code", "closed_form"}
        The official three-operand einsum (default) or the paper's collinear closed form.
    position_ids : array (N,) or (B, N), optional
        Rotary positions, default ``arange(N)``.
    rope_theta : float
        RoPE base (10000).
    is_causal : bool
        Causal mask (default True, as the Llama decoder).
    attn_mask : bool or additive float array broadcastable to (B, H, N, N), optional
    scale : float, optional
        Default $d^{-1/2}$.

    Returns
    -------
    y, cache
        ``y (B, N, C)``.
    """
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    h = check_size(num_heads, "num_heads")
    hkv = h if num_key_value_heads is None else check_size(num_key_value_heads, "num_key_value_heads")
    check_choice(coca_mode, "coca_mode", COCA_MODES)
    rope_theta = check_positive(rope_theta, "rope_theta")
    scale = check_positive(scale, "scale", allow_none=True)
    spec, optional = coca_param_spec(c, h, hkv)
    p = check_params(params, spec, optional=optional, where="coca_attention (weights (in, out); torch weight.T)")
    pos = _validate_positions(position_ids, b, n)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    d = c // h
    s = float(d ** -0.5) if scale is None else scale
    ang = coca_position_angles(pos, n, d, rope_theta)
    cos, sin = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
    q = split_heads(linear_prefixed(p, "q_proj", x), h)
    traw = split_heads(linear_prefixed(p, "t_proj", x), hkv)
    v = split_heads(linear_prefixed(p, "v_proj", x), hkv)
    hd = d // 2
    tpre = 0.5 * (traw[..., :hd] + traw[..., hd:])
    tau = np.maximum(tpre, 0.0)
    qt, kt, qr = _factors(q, tau, cos, sin, coca_mode)
    o, core = attention_core_forward(qt, kt, v, attn_mask=attn_mask, is_causal=is_causal, scale=s)
    om = merge_heads(o)
    y = linear_prefixed(p, "o_proj", om)
    cache = {"x": x, "p": p, "q": q, "qr": qr, "tpre": tpre, "tau": tau, "cos": cos, "sin": sin, "core": core,
             "om": om, "h": h, "hkv": hkv, "mode": coca_mode, "shape": y.shape}
    return y, cache


def coca_attention_backward(dout, cache):
    """Gradient of :func:`coca_attention_forward`: ``x`` and every parameter (derivation in the module docstring)."""
    p, x, h = cache["p"], cache["x"], cache["h"]
    q, cos, sin = cache["q"], cache["cos"], cache["sin"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    dom = linear_prefixed_vjp(grads, p, "o_proj", g, cache["om"])
    gc = attention_core_backward(split_heads(dom, h), cache["core"])
    dqt, dkt, dv = gc["q"], gc["k"], gc["v"]
    hd = q.shape[-1] // 2
    if cache["mode"] == "code":
        dq = dqt * cache["qr"] + apply_rope(dqt * q, cos, -sin)
        dtb = apply_rope(dkt, cos, -sin)
        dtau = dtb[..., :hd] + dtb[..., hd:]
    else:
        da = dqt[..., :hd] * cos + dqt[..., hd:] * sin
        dq = np.concatenate([2.0 * q[..., :hd] * da, 2.0 * q[..., hd:] * da], axis=-1)
        dtau = dkt[..., :hd] * cos + dkt[..., hd:] * sin
    dtp = 0.5 * np.where(cache["tpre"] > 0, dtau, 0.0)
    dtraw = np.concatenate([dtp, dtp], axis=-1)
    dx = linear_prefixed_vjp(grads, p, "q_proj", merge_heads(dq), x)
    dx = dx + linear_prefixed_vjp(grads, p, "t_proj", merge_heads(dtraw), x)
    dx = dx + linear_prefixed_vjp(grads, p, "v_proj", merge_heads(dv), x)
    return {"x": dx, **{k: grads[k] for k in p}}


def coca_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`coca_attention_forward`."""
    return coca_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, mode=None):
    mode = mode or str(rng.choice(COCA_MODES))
    if size == "tiny":
        n, c, h = int(rng.integers(2, 4)), 4, 2
    else:
        n, c, h = int(rng.integers(4, 8)), 8, int(rng.choice([2, 4]))
    hkv = int(rng.choice([1, h])) if h > 1 else 1
    x = rng.standard_normal((2, n, c))
    margin = 0.05 if size == "tiny" else 5e-3
    for _ in range(200):  # keep the ReLU input of t away from its kink (FD steps ~1e-6 tiny, ~1e-5 directional)
        p = init_coca_params(rng, c, h, hkv, bias=size == "small" and rng.random() < 0.5)
        p = {k: 1.5 * v for k, v in p.items()}
        t = x @ p["t_proj.weight"] + p.get("t_proj.bias", 0.0)
        t = t.reshape(2, n, hkv, -1)
        if np.abs(0.5 * (t[..., : t.shape[-1] // 2] + t[..., t.shape[-1] // 2:])).min() > margin:
            break
    cfg = {"num_heads": h, "num_key_value_heads": hkv, "coca_mode": mode, "is_causal": bool(rng.random() < 0.7)}
    if rng.random() < 0.5:
        cfg["position_ids"] = np.sort(rng.uniform(0.0, 3.0 * n, size=(2, n)), axis=-1)
    else:
        cfg["rope_theta"] = 100.0
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _rot(a, b, phi):
    return a * np.cos(phi) - b * np.sin(phi), a * np.sin(phi) + b * np.cos(phi)


def _reference(x, params, *, num_heads, num_key_value_heads=None, coca_mode="code", position_ids=None,
               rope_theta=10000.0, is_causal=True, attn_mask=None, scale=None):
    # Per (batch, head, i, j), rotary plane by plane: the einsum of the code or the collinear closed form.
    bsz, n, c = x.shape
    h = num_heads
    hkv = h if num_key_value_heads is None else num_key_value_heads
    d, r = c // h, h // hkv
    hd = d // 2
    s = d ** -0.5 if scale is None else scale
    lin = {k: x @ params[f"{k}.weight"] + params.get(f"{k}.bias", 0.0) for k in ("q_proj", "t_proj", "v_proj")}
    theta = np.array([rope_theta ** (-2.0 * m / d) for m in range(hd)])
    out = np.zeros((bsz, n, h * d))
    for bb in range(bsz):
        pos = np.arange(n, dtype=float) if position_ids is None else np.broadcast_to(position_ids, (bsz, n))[bb]
        for hh in range(h):
            g = hh // r
            q = lin["q_proj"][bb, :, hh * d:(hh + 1) * d]
            t = lin["t_proj"][bb, :, g * d:(g + 1) * d]
            v = lin["v_proj"][bb, :, g * d:(g + 1) * d]
            tau = np.maximum(0.5 * (t[:, :hd] + t[:, hd:]), 0.0)
            e = np.zeros((n, n))
            for i in range(n):
                for j in range(n):
                    for m in range(hd):
                        qa, qb = q[i, m], q[i, m + hd]
                        if coca_mode == "code":
                            ra, rb = _rot(qa, qb, pos[i] * theta[m])
                            ta, tb = _rot(tau[j, m], tau[j, m], pos[j] * theta[m])
                            e[i, j] += qa * ta * ra + qb * tb * rb
                        else:
                            e[i, j] += tau[j, m] * (qa * qa + qb * qb) * np.cos((pos[i] - pos[j]) * theta[m])
            e *= s
            if is_causal:
                e = np.where(np.tri(n, dtype=bool), e, -np.inf)
            w = np.exp(e - e.max(-1, keepdims=True))
            out[bb, :, hh * d:(hh + 1) * d] = (w / w.sum(-1, keepdims=True)) @ v
    return out @ params["o_proj.weight"] + params.get("o_proj.bias", 0.0)


def _check_tau_nonnegative(rng):
    # t >= 0 is enforced: the magnitudes are ReLU'd and both rotary halves of t carry the same value.
    t = rng.standard_normal((3, 5, 8))
    tau = coca_key_magnitudes(t)
    assert tau.shape == (3, 5, 4) and tau.min() >= 0.0 and (tau == 0).any() and (tau > 0).any()
    err = float(np.abs(tau - np.maximum((t[..., :4] + t[..., 4:]) / 2, 0)).max())
    assert err == 0.0, err
    return err


def _check_closed_form_is_collinear_key(rng):
    # The closed form equals RoPE scores against the explicit collinear key k_ij = tau_j (.) q_i (per plane).
    n, d = 5, 6
    q, tau = rng.standard_normal((n, d)), np.abs(rng.standard_normal((n, d // 2)))
    ang = coca_position_angles(rng.uniform(0, 20, n), n, d, 50.0)
    cos, sin = np.cos(ang), np.sin(ang)
    got = coca_scores(q, tau, cos, sin, "closed_form")
    want = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            k = np.concatenate([tau[j] * q[i, :3], tau[j] * q[i, 3:]])
            want[i, j] = apply_rope(q[i], cos[i], sin[i]) @ apply_rope(k, cos[j], sin[j])
    err = float(np.abs(got - want).max())
    assert err < 1e-12, err
    return err


def _check_modes_conflict(rng):
    # The official einsum equals the closed form iff every sin(p theta) vanishes (all positions 0); otherwise
    # it differs by s * sum_m tau_jm [(b^2 - a^2) c_i s_j - (a - b)^2 s_i s_j] (the catalogue's conflict).
    n, d = 4, 4
    q, tau = rng.standard_normal((n, d)), np.abs(rng.standard_normal((n, d // 2)))
    zero = coca_position_angles(np.zeros(n), n, d)
    e0 = float(np.abs(coca_scores(q, tau, np.cos(zero), np.sin(zero), "code")
                      - coca_scores(q, tau, np.cos(zero), np.sin(zero), "closed_form")).max())
    ang = coca_position_angles(None, n, d, 10.0)
    c, s_ = np.cos(ang), np.sin(ang)
    diff = coca_scores(q, tau, c, s_, "code") - coca_scores(q, tau, c, s_, "closed_form")
    a, b = q[:, :2], q[:, 2:]
    want = ((b * b - a * a) * c) @ (tau * s_).T - ((a - b) ** 2 * s_) @ (tau * s_).T
    e1 = float(np.abs(diff - want).max())
    assert e0 < 1e-12 and e1 < 1e-12 and np.abs(diff).max() > 1e-2, (e0, e1)
    return max(e0, e1)


def _check_memory_quadratic(rng):
    # The forward never materialises an N x N x d tensor: its peak allocation stays well below one.
    import tracemalloc
    bsz, n, c, h = 1, 64, 128, 2
    x = rng.standard_normal((bsz, n, c))
    p = init_coca_params(rng, c, h)
    peaks = []
    for mode in COCA_MODES:
        coca_attention_forward(x, p, num_heads=h, coca_mode=mode)  # warm-up
        tracemalloc.start()
        coca_attention_forward(x, p, num_heads=h, coca_mode=mode)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    nnd = bsz * h * n * n * (c // h) * 8
    assert max(peaks) < nnd / 4, (peaks, nnd)
    return max(peaks) / nnd


def _gradcheck_mode(mode):
    def check(rng):
        from ...testing import gradcheck
        return gradcheck(coca_attention_forward, coca_attention_backward, _sample(rng, "tiny", mode)).max_rel
    return check


register(
    Mechanism(
        slug="coca_collinear_attention", family="1-softmax", tier="T2",
        title="Collinear Constrained Attention (CoCA)",
        paper="Zhu, Ye, Jiang, Xue, Zhang, Wu, Li, CoCA: Fusing Position Embedding with Collinear Constrained "
              "Attention in Transformers for Long Context Window Extending, ACL 2024, arXiv 2309.08646",
        forward=coca_attention_forward, backward=coca_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/positional-encodings.md#coca-collinear-constrained-attention",
        checks={"tau_nonnegative": _check_tau_nonnegative,
                "closed_form_is_collinear_key": _check_closed_form_is_collinear_key,
                "modes_conflict": _check_modes_conflict, "memory_quadratic": _check_memory_quadratic,
                "gradcheck_code": _gradcheck_mode("code"), "gradcheck_closed_form": _gradcheck_mode("closed_form")},
    ),
)
