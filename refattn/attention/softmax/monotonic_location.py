r"""Monotonic location attention (OneStepAttn, MonoAttn, RMonoAttn and their content-mixed forms)
with the forward/reverse interpolation of the encoder states, recurrent over decoder steps, with the
backward through time.

Paper: Ray Chowdhury, Caragea, "Monotonic Location Attention for Length Generalization", ICML 2023,
arXiv 2305.20019 (location attention after Dubois et al., "Location Attention for Extrapolation to
Longer Sequences", ACL 2020). Upstream: JRC1995/MonotonicLocationAttention
@234f5b5561859c80cd647a0a9b4e97dce2c00dc9 — ``models/attentions/Multiheaded_Monotonic_Attention.py``
(the attention) and ``models/layers/GRUEncoderDecoder.py`` (the forward/reverse mixing, the value
transform and the decoder loop that carries ``past_attention``); the model names map to
``configs/*_configs.py``: OneStepAttn = ``step_act="sigmoid"``, MonoAttn = ``"controlled_relu"``,
RMonoAttn = ``"relu"`` (all with ``mix_forward_reverse`` and location attention only; "Mix ..." adds
content attention). This is a T3 entry: everything below is read from that code.

Memory
------
Encoder states $m_j$ ($j < L$ valid, ``memory_mask``), reversed within the valid length,
$\bar m_j = m_{L-1-j}$ ($0$ beyond $L$), and mixed by a gate read from the first decoder state
(upstream's $h_0$ = the encoder's final state, which is also the query of step 0):

$$g = \sigma\big(5\,(s_0w_{\rm dir} + b_{\rm dir})\big),\qquad \tilde m = g\,m + (1-g)\,\bar m\quad
(\texttt{mix\_forward\_reverse=True});$$

keys are $\tilde m$, values $\nu = \mathrm{LeakyReLU}_{0.01}(\tilde mW_{\rm val} + b_{\rm val})$
(``value_transform``, part of the encoder-decoder upstream).

Attention at decoder step $t$ (per head $h$)
----------------------------------------------
Positions are normalised, $\pi_j = j\,\delta$ with $\delta = 1/\max(1, L-1)$. With
$\hat q = s_tW_{\rm pos} + b_{\rm pos}$ split into heads (``position_state_linear``):

$$\sigma = \frac{\mathrm{ReLU}(\hat q\,w_\sigma) + 0.27}{L},\qquad \rho = \hat q\,w_\rho,\qquad
\mu_t = \mathrm{step}(\rho)\,\delta + \bar\mu_{t-1}\ \ (\bar\mu_{-1} = 0),$$
$$\phi_{tj} = \frac{\exp\!\big(-(\pi_j-\mu_t)^2/2\sigma^2\big)\,[j<L]}{\sum_{j'}\big(\exp(\cdot)[j'<L] + 10^{-20}\big)},\qquad
\bar\mu_t = \sum_j\phi_{tj}\pi_j,$$

with $\mathrm{step}$ = ``step_act``: ``"sigmoid"`` $\sigma(5\rho)$ (OneStepAttn), ``"controlled_relu"``
$c\,\mathrm{ReLU}(\rho) + (1-c)\sigma(5\rho)$, $c = \sigma(\texttt{step\_bias})$ (MonoAttn; ``step_bias``
starts at 20), ``"relu"`` (RMonoAttn), ``"free"`` ($\rho$), ``"softstair"``
$\lfloor\rho\rfloor + \sigma(\tau(\rho - \lfloor\rho\rfloor - \tfrac12))$ ($\tau$ = ``softstair_temp``, 20). With
``mix_attention`` the weights are $a = \lambda\phi + (1-\lambda)\,\mathrm{softmax}(d^{-1/2}(s_tW_q)(\tilde mW_k)^\top)$,
$\lambda = \sigma(s_tw_{\rm mix} + b_{\rm mix})$, and $\bar\mu_t$ uses $a$ unless ``position_past`` (upstream
computes the mix only when ``location_attention_only`` is off; its "Mix MonoAttn" configs leave it on,
which disables the mix). Output $o_t = [a_1(\nu W_v)_1\|\dots\|a_H(\nu W_v)_H]\,W_{\rm hc}$
(``value_linear``, ``head_compose_linear``, no biases); ``(B, T, D_{out})``. Attention dropout is
inactive (inference).

Parameters as the ``GRUEncoderDecoder`` ``state_dict`` (linear weights ``(in, out)``):
``dir_gater.*``, ``value_transform.*``, and ``attention_layer.``\ {``position_state_linear.*``,
``Wsigma (H, d, 1)``, ``Wrho (H, d, 1)``, ``step_bias (1,)``, ``value_linear.weight``,
``head_compose_linear.weight``; with ``mix_attention``: ``query_linear.weight``, ``key_linear.weight``,
``mix_scorer.*``}.

Backward through time
---------------------
Steps are visited in reverse with the carried $\bar g_t = \partial\mathcal L/\partial\bar\mu_t$. At step
$t$: $\partial/\partial\phi \mathrel{+}= \bar g_t\pi$; the normalisation $\phi = e/Z$ gives
$de = (d\phi - \sum d\phi\,\phi)/Z$; the Gaussian $\exp(E)$ with $E = -x^2/2\sigma^2$, $x = \pi - \mu$:
$d\mu = \sum_j dE_j\,x_j/\sigma^2$, $d\sigma = \sum_j dE_j\,x_j^2/\sigma^3$ ($dE = de\odot e$); then
$\bar g_{t-1} = d\mu$ (the recurrence), $d\,\mathrm{step} = \delta\,d\mu$, the step activation and the
ReLU of $\sigma$ (0 at the kinks; samplers keep $\hat q w_\sigma$ and $\rho$ away from 0), the head
projections $w_\sigma, w_\rho$ and ``position_state_linear``. The content branch is the attention VJP,
the gate $\lambda$ its sigmoid. Finally the values and keys send their gradients to $\tilde m$, and
the mix to $m$ (the reversal's adjoint is the same index map) and to $s_0$ through $g$.

Agreement with upstream (measured)
---------------------------------
Upstream ``Multiheaded_Monotonic_Attention`` run in float64 torch (CPU), driven by a transcription of
``GRUEncoderDecoder``'s decoder loop (mix gate from $h_0$, the reversal, value transform, carried
``past_attention``), output and every gradient: worst abs / rel ``controlled_relu``
$1.4\cdot10^{-13}$ / $1.3\cdot10^{-14}$, ``sigmoid`` $2.6\cdot10^{-14}$ / $1.6\cdot10^{-14}$, ``relu``
$1.5\cdot10^{-12}$ / $3.5\cdot10^{-14}$, ``free`` $1.1\cdot10^{-13}$ / $5.3\cdot10^{-15}$, ``softstair``
$2.7\cdot10^{-13}$ / $2.1\cdot10^{-14}$ (all ``mix_forward_reverse=False``), ``controlled_relu`` with the
mix $8.9\cdot10^{-15}$ / $4.1\cdot10^{-15}$, ``sigmoid`` with the mix and ``position_past``
$7.1\cdot10^{-15}$ / $4.9\cdot10^{-15}$. ``step_bias`` is used only by ``controlled_relu``; for the other
activations upstream has no gradient for it and refattn returns zeros.
"""

from __future__ import annotations

import numpy as np

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
from ...nn.linear import merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "STEP_ACTIVATIONS",
    "monotonic_location_param_spec",
    "init_monotonic_location_params",
    "reverse_within_length",
    "monotonic_location_forward",
    "monotonic_location_backward",
    "monotonic_location_attention",
]

STEP_ACTIVATIONS = ("sigmoid", "controlled_relu", "relu", "free", "softstair")
_SIGMA_FLOOR = 0.27
_SUM_EPS = 1e-20
_LEAK = 0.01
_A = "attention_layer."


def monotonic_location_param_spec(query_dim: int, memory_dim: int, *, heads: int, qk_head_dim: int,
                                  value_dim: int, v_head_dim: int, out_dim: int, mix_forward_reverse: bool = True,
                                  mix_attention: bool = False) -> dict:
    """``check_params`` spec (``GRUEncoderDecoder`` ``state_dict`` names)."""
    h, d = heads, qk_head_dim
    spec = {}
    if mix_forward_reverse:
        spec.update({"dir_gater.weight": (query_dim, 1), "dir_gater.bias": (1,)})
    spec.update({"value_transform.weight": (memory_dim, value_dim), "value_transform.bias": (value_dim,),
                 _A + "position_state_linear.weight": (query_dim, h * d), _A + "position_state_linear.bias": (h * d,),
                 _A + "Wsigma": (h, d, 1), _A + "Wrho": (h, d, 1), _A + "step_bias": (1,),
                 _A + "value_linear.weight": (value_dim, h * v_head_dim),
                 _A + "head_compose_linear.weight": (h * v_head_dim, out_dim)})
    if mix_attention:
        spec.update({_A + "query_linear.weight": (query_dim, h * d), _A + "key_linear.weight": (memory_dim, h * d),
                     _A + "mix_scorer.weight": (query_dim, 1), _A + "mix_scorer.bias": (1,)})
    return spec


def init_monotonic_location_params(rng, query_dim: int, memory_dim: int, *, scale: float = 1.0, **sizes) -> dict:
    """Random parameters in spec order (normal, std ``scale / sqrt(fan_in)``; ``step_bias`` = 20 as
    upstream's init, other biases small normal); ``sizes`` as `monotonic_location_param_spec`."""
    out = {}
    for k, s in monotonic_location_param_spec(query_dim, memory_dim, **sizes).items():
        if k.endswith("step_bias"):
            out[k] = np.full(s, 20.0)
        elif len(s) == 1:
            out[k] = 0.1 * rng.standard_normal(s)
        else:
            out[k] = (scale / np.sqrt(s[-2] if len(s) == 3 else s[0])) * rng.standard_normal(s)
    return out


def reverse_within_length(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``x (B, S, D)`` with each row's first ``lengths[b]`` entries reversed and zeros after them
    (upstream's flip-and-shift of the padded encoder states). It is its own adjoint on the valid part."""
    b, s = x.shape[:2]
    j = np.arange(s)[None, :]
    src = lengths[:, None] - 1 - j
    valid = src >= 0
    out = np.take_along_axis(x, np.clip(src, 0, s - 1)[..., None], axis=1)
    return np.where(valid[..., None], out, 0.0).astype(x.dtype, copy=False)


def _step_fn(rho, act, step_bias, temp):
    if act == "sigmoid":
        s5 = sigmoid(5.0 * rho)
        return s5, {"s5": s5}
    if act == "relu":
        return np.maximum(rho, 0.0), {}
    if act == "free":
        return rho, {}
    if act == "softstair":
        fl = np.floor(rho)
        sg = sigmoid(temp * (rho - fl - 0.5))
        return fl + sg, {"sg": sg}
    sb = sigmoid(step_bias)
    s5 = sigmoid(5.0 * rho)
    return sb * np.maximum(rho, 0.0) + (1.0 - sb) * s5, {"s5": s5, "sb": sb}


def _step_vjp(dsteps, rho, act, aux, temp):
    """``(drho, dstep_bias)`` for upstream gradient ``dsteps``."""
    if act == "sigmoid":
        return dsteps * 5.0 * aux["s5"] * (1.0 - aux["s5"]), 0.0
    if act == "relu":
        return dsteps * (rho > 0), 0.0
    if act == "free":
        return dsteps, 0.0
    if act == "softstair":
        return dsteps * temp * aux["sg"] * (1.0 - aux["sg"]), 0.0
    sb, s5 = aux["sb"], aux["s5"]
    drho = dsteps * (sb * (rho > 0) + (1.0 - sb) * 5.0 * s5 * (1.0 - s5))
    dsb = np.sum(dsteps * (np.maximum(rho, 0.0) - s5)) * sb * (1.0 - sb)
    return drho, dsb


def monotonic_location_forward(query, memory, params, *, heads: int, memory_mask=None,
                               step_act: str = "controlled_relu", mix_forward_reverse: bool = True,
                               mix_attention: bool = False, position_past: bool = False, softstair_temp: float = 20.0):
    r"""Monotonic location attention over all decoder steps (module docstring).

    Parameters
    ----------
    query : array (B, T, D_q)
        Decoder state $s_t$ before each step ($s_0$ also drives the direction gate).
    memory : array (B, S, D_m)
        Encoder states.
    params : dict
        ``monotonic_location_param_spec`` keys; head widths read from the shapes.
    heads : int
    memory_mask : bool array (B, S), optional
        True = valid; each row must be a prefix (lengths $L_b \ge 1$). Default: all valid.
    step_act : {"sigmoid", "controlled_relu", "relu", "free", "softstair"}
        OneStepAttn, MonoAttn (default), RMonoAttn, FreeStep, SoftStairStep.
    mix_forward_reverse, mix_attention, position_past : bool
    softstair_temp : float

    Returns
    -------
    out, cache
        ``(B, T, D_out)``; ``cache["phi"]`` the location weights ``(B, T, H, S)``.
    """
    q = as_float(query, "query", ndim=3)
    m = as_float(memory, "memory", ndim=3)
    if m.shape[0] != q.shape[0]:
        raise ValueError(f"memory must have query's batch size {q.shape[0]} on axis 0; got shape {m.shape}")
    nh = check_size(heads, "heads")
    check_choice(step_act, "step_act", STEP_ACTIVATIONS)
    for flag, name in ((mix_forward_reverse, "mix_forward_reverse"), (mix_attention, "mix_attention"),
                       (position_past, "position_past")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    temp = check_positive(softstair_temp, "softstair_temp")
    b, s = m.shape[:2]
    if memory_mask is None:
        memory_mask = np.ones((b, s), bool)
    memory_mask = np.asarray(memory_mask)
    if memory_mask.dtype != np.bool_ or memory_mask.shape != (b, s):
        raise ValueError(f"memory_mask must be a boolean array of shape (B, S) = {(b, s)}; got "
                         f"{memory_mask.dtype} {memory_mask.shape}")
    lengths = memory_mask.sum(axis=1)
    if np.any(lengths < 1) or np.any(memory_mask != (np.arange(s)[None, :] < lengths[:, None])):
        raise ValueError("memory_mask rows must be prefixes of at least one valid position (True then False)")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see monotonic_location_param_spec); got {type(params).__name__}")
    shp = {k: np.shape(params.get(_A + k)) for k in ("Wsigma", "value_linear.weight", "head_compose_linear.weight")}
    if len(shp["Wsigma"]) != 3 or len(shp["value_linear.weight"]) != 2 or len(shp["head_compose_linear.weight"]) != 2:
        raise ValueError(f"params must hold attention_layer.Wsigma (H, d, 1), value_linear.weight and "
                         f"head_compose_linear.weight; got shapes {shp}")
    d = shp["Wsigma"][1]
    # value_dim is read off value_linear's input axis: check it against value_transform's output first
    vt = check_weight_in(params, "value_transform.weight", m.shape[-1], input_name="memory")
    if vt:
        check_weight_in(params, _A + "value_linear.weight", vt[1], input_name="value_transform's output")
    dv, hvd = shp["value_linear.weight"]
    if hvd % nh:
        raise ValueError(f"attention_layer.value_linear.weight must have heads * v_head_dim columns; got {hvd} for heads={nh}")
    spec = monotonic_location_param_spec(q.shape[-1], m.shape[-1], heads=nh, qk_head_dim=d, value_dim=dv,
                                         v_head_dim=hvd // nh, out_dim=shp["head_compose_linear.weight"][1],
                                         mix_forward_reverse=bool(mix_forward_reverse), mix_attention=bool(mix_attention))
    p = check_params(params, spec, where="monotonic_location (Multiheaded_Monotonic_Attention)")
    dt = compute_dtype(q, m, *p.values())
    q, m, p = q.astype(dt, copy=False), m.astype(dt, copy=False), cast_all(dt, p)
    c = {"q": q, "m": m, "p": p, "nh": nh, "act": step_act, "temp": temp, "mix_fr": bool(mix_forward_reverse),
         "mix": bool(mix_attention), "pos_past": bool(position_past) or not mix_attention, "lengths": lengths,
         "mask": memory_mask}
    if mix_forward_reverse:
        rev = reverse_within_length(m, lengths)
        gate = sigmoid(5.0 * (q[:, 0] @ p["dir_gater.weight"] + p["dir_gater.bias"]))[:, :, None]   # (B, 1, 1)
        mt = gate * m + (1.0 - gate) * rev
        c.update(rev=rev, gate=gate)
    else:
        mt = m
    vpre = mt @ p["value_transform.weight"] + p["value_transform.bias"]
    vals = np.where(vpre > 0, vpre, _LEAK * vpre)
    vh = split_heads(vals @ p[_A + "value_linear.weight"], nh)                  # (B, H, S, vd)
    c.update(mt=mt, vpre=vpre, vals=vals, vh=vh)
    if mix_attention:
        kh = split_heads(mt @ p[_A + "key_linear.weight"], nh)                   # (B, H, S, d)
        c["kh"] = kh
    delta = (1.0 / np.maximum(1, lengths - 1)).astype(dt)                      # (B,)
    pos = np.arange(s, dtype=dt)[None, :] * delta[:, None]                     # (B, S)
    lf = lengths.astype(dt)
    c.update(delta=delta, pos=pos)
    past = np.zeros((b, nh), dt)
    steps, outs = [], []
    for t in range(q.shape[1]):
        st = {"past": past}
        qp = (q[:, t] @ p[_A + "position_state_linear.weight"] + p[_A + "position_state_linear.bias"]).reshape(b, nh, d)
        tmp = np.einsum("bhd,hd->bh", qp, p[_A + "Wsigma"][..., 0])
        sig = (np.maximum(tmp, 0.0) + _SIGMA_FLOOR) / lf[:, None]
        rho = np.einsum("bhd,hd->bh", qp, p[_A + "Wrho"][..., 0])
        stp, aux = _step_fn(rho, step_act, p[_A + "step_bias"][0], temp)
        mu = stp * delta[:, None] + past
        x = pos[:, None, :] - mu[..., None]                                     # (B, H, S)
        ex = np.exp(-x * x / (2.0 * sig[..., None] ** 2)) * memory_mask[:, None, :]
        z = ex.sum(axis=-1, keepdims=True) + s * _SUM_EPS
        phi = ex / z
        a = phi
        if mix_attention:
            qc = (q[:, t] @ p[_A + "query_linear.weight"]).reshape(b, nh, d)
            lg = np.einsum("bhd,bhsd->bhs", qc, c["kh"]) * float(d ** -0.5)
            ca, _ = softmax_lse(np.where(memory_mask[:, None, :], lg, -np.inf), axis=-1)
            lam = sigmoid(q[:, t] @ p[_A + "mix_scorer.weight"] + p[_A + "mix_scorer.bias"])   # (B, 1)
            a = lam[..., None] * phi + (1.0 - lam[..., None]) * ca
            st.update(qc=qc, ca=ca, lam=lam)
        att = np.einsum("bhs,bhsv->bhv", a, vh)
        mrg = att.reshape(b, -1)
        outs.append(mrg @ p[_A + "head_compose_linear.weight"])
        past = np.sum((phi if c["pos_past"] else a) * pos[:, None, :], axis=-1)
        st.update(qp=qp, tmp=tmp, sig=sig, rho=rho, aux=aux, x=x, ex=ex, z=z, phi=phi, a=a, mrg=mrg)
        steps.append(st)
    out = np.stack(outs, axis=1)
    c.update(steps=steps, phi=np.stack([st["phi"] for st in steps], axis=1), shape=out.shape)
    return out, c


def monotonic_location_backward(dout, cache):
    """Gradient of :func:`monotonic_location_forward` (backward through the decoder steps):
    ``query``, ``memory`` and every parameter."""
    q, m, p, nh = cache["q"], cache["m"], cache["p"], cache["nh"]
    g = as_dout(dout, cache["shape"], q.dtype)
    b, s = m.shape[:2]
    grads = {k: np.zeros_like(v) for k, v in p.items()}
    dq = np.zeros_like(q)
    dvh = np.zeros_like(cache["vh"])
    dkh = np.zeros_like(cache["kh"]) if cache["mix"] else None
    pos, delta, lf = cache["pos"], cache["delta"], cache["lengths"].astype(q.dtype)
    d = p[_A + "Wsigma"].shape[1]
    carry = np.zeros((b, nh), q.dtype)
    for t in range(q.shape[1] - 1, -1, -1):
        st = cache["steps"][t]
        gt = g[:, t]
        grads[_A + "head_compose_linear.weight"] += st["mrg"].T @ gt
        datt = (gt @ p[_A + "head_compose_linear.weight"].T).reshape(b, nh, -1)
        dvh += st["a"][..., None] * datt[:, :, None, :]
        da = np.einsum("bhv,bhsv->bhs", datt, cache["vh"])
        dphi = np.zeros_like(st["phi"])
        if cache["pos_past"]:
            dphi += carry[..., None] * pos[:, None, :]
        else:
            da = da + carry[..., None] * pos[:, None, :]
        if cache["mix"]:
            lam, ca = st["lam"], st["ca"]
            dphi += lam[..., None] * da
            dlam = np.sum(da * (st["phi"] - ca), axis=(1, 2))[:, None] * lam * (1.0 - lam)
            grads[_A + "mix_scorer.weight"] += q[:, t].T @ dlam
            grads[_A + "mix_scorer.bias"] += dlam.sum(axis=0)
            dq[:, t] += dlam @ p[_A + "mix_scorer.weight"].T
            dlg = softmax_vjp(ca, (1.0 - lam[..., None]) * da) * float(d ** -0.5)
            dqc = np.einsum("bhs,bhsd->bhd", dlg, cache["kh"])
            dkh += dlg[..., None] * st["qc"][:, :, None, :]
            grads[_A + "query_linear.weight"] += q[:, t].T @ dqc.reshape(b, -1)
            dq[:, t] += dqc.reshape(b, -1) @ p[_A + "query_linear.weight"].T
        else:
            dphi += da
        phi, ex, z, x, sig = st["phi"], st["ex"], st["z"], st["x"], st["sig"]
        dex = (dphi - np.sum(dphi * phi, axis=-1, keepdims=True)) / z
        dexp = dex * ex
        s2 = sig[..., None] ** 2
        dmu = np.sum(dexp * x / s2, axis=-1)
        dsig = np.sum(dexp * x * x / (s2 * sig[..., None]), axis=-1)
        carry = dmu
        drho, dsb = _step_vjp(dmu * delta[:, None], st["rho"], cache["act"], st["aux"], cache["temp"])
        grads[_A + "step_bias"] += dsb
        dtmp = dsig / lf[:, None] * (st["tmp"] > 0)
        qp = st["qp"]
        grads[_A + "Wsigma"][..., 0] += np.einsum("bh,bhd->hd", dtmp, qp)
        grads[_A + "Wrho"][..., 0] += np.einsum("bh,bhd->hd", drho, qp)
        dqp = (dtmp[..., None] * p[_A + "Wsigma"][..., 0] + drho[..., None] * p[_A + "Wrho"][..., 0]).reshape(b, -1)
        grads[_A + "position_state_linear.weight"] += q[:, t].T @ dqp
        grads[_A + "position_state_linear.bias"] += dqp.sum(axis=0)
        dq[:, t] += dqp @ p[_A + "position_state_linear.weight"].T
    mt, vals = cache["mt"], cache["vals"]
    dv_flat = merge_heads(dvh)                                                   # (B, S, H*vd)
    grads[_A + "value_linear.weight"] = vals.reshape(-1, vals.shape[-1]).T @ dv_flat.reshape(-1, dv_flat.shape[-1])
    dvpre = dv_flat @ p[_A + "value_linear.weight"].T
    dvpre = np.where(cache["vpre"] > 0, dvpre, _LEAK * dvpre)
    grads["value_transform.weight"] = mt.reshape(-1, mt.shape[-1]).T @ dvpre.reshape(-1, dvpre.shape[-1])
    grads["value_transform.bias"] = dvpre.reshape(-1, dvpre.shape[-1]).sum(axis=0)
    dmt = dvpre @ p["value_transform.weight"].T
    if cache["mix"]:
        dk_flat = merge_heads(dkh)
        grads[_A + "key_linear.weight"] = mt.reshape(-1, mt.shape[-1]).T @ dk_flat.reshape(-1, dk_flat.shape[-1])
        dmt = dmt + dk_flat @ p[_A + "key_linear.weight"].T
    if cache["mix_fr"]:
        gate, rev = cache["gate"], cache["rev"]
        dgate = np.sum(dmt * (m - rev), axis=(1, 2))[:, None] * 5.0 * gate[:, :, 0] * (1.0 - gate[:, :, 0])
        grads["dir_gater.weight"] = q[:, 0].T @ dgate
        grads["dir_gater.bias"] = dgate.sum(axis=0)
        dq[:, 0] += dgate @ p["dir_gater.weight"].T
        dm = gate * dmt + reverse_within_length((1.0 - gate) * dmt, cache["lengths"])
    else:
        dm = dmt
    return {"query": dq, "memory": dm, **{k: grads[k] for k in p}}


def monotonic_location_attention(query, memory, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`monotonic_location_forward`."""
    return monotonic_location_forward(query, memory, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_cfg(rng, size, step_act=None, mix_attention=None, position_past=False):
    if size == "tiny":
        b, t, s, dq, dm, nh, d, dv, vd, do = 2, 3, 4, 2, 2, 1, 2, 2, 1, 2
    else:
        b, t, s, dq, dm, nh, d, dv, vd, do = 2, int(rng.integers(3, 6)), int(rng.integers(4, 8)), 4, 3, 2, 2, 3, 2, 3
    act = str(rng.choice(STEP_ACTIVATIONS)) if step_act is None else step_act
    mix = bool(rng.random() < 0.3) if mix_attention is None else mix_attention
    mfr = True if size == "tiny" else bool(rng.random() < 0.7)
    sizes = dict(heads=nh, qk_head_dim=d, value_dim=dv, v_head_dim=vd, out_dim=do, mix_forward_reverse=mfr,
                 mix_attention=mix)
    cfg = {"heads": nh, "step_act": act, "mix_forward_reverse": mfr, "mix_attention": mix, "position_past": position_past}
    lengths = np.array([s, s - 1]) if size == "small" else np.array([s, s])
    cfg["memory_mask"] = np.arange(s)[None, :] < lengths[:, None]
    for _ in range(500):
        p = init_monotonic_location_params(rng, dq, dm, scale=1.5, **sizes)
        if act == "controlled_relu":
            p[_A + "step_bias"] = np.array([float(rng.uniform(-1.0, 1.0))])   # both branches active
        qq, mm = rng.standard_normal((b, t, dq)), rng.standard_normal((b, s, dm))
        _, c = monotonic_location_forward(qq, mm, p, **cfg)
        margins = [np.abs(c["vpre"]).min()] + [np.abs(st["tmp"]).min() for st in c["steps"]]
        if act in ("controlled_relu", "relu"):
            margins += [np.abs(st["rho"]).min() for st in c["steps"]]
        if act == "softstair":
            margins += [np.abs(st["rho"] - np.round(st["rho"])).min() for st in c["steps"]]
        if min(margins) > 2e-3 and min(float(st["z"].min()) for st in c["steps"]) > 1e-6:
            return Sample(inputs={"query": qq, "memory": mm}, params=p, config=cfg)
    raise AssertionError("could not draw monotonic-location inputs away from the kinks")


def _sample(rng, size):
    return _sample_cfg(rng, size)


def _reference(query, memory, params, *, heads, memory_mask=None, step_act="controlled_relu", mix_forward_reverse=True,
               mix_attention=False, position_past=False, softstair_temp=20.0):
    # Upstream's step loop, per sample and head with explicit loops; the reversal by flip-and-shift.
    p = {k.replace(_A, ""): v for k, v in params.items()}
    b, t, _ = query.shape
    s = memory.shape[1]
    mask = np.ones((b, s), bool) if memory_mask is None else memory_mask
    d = p["Wsigma"].shape[1]
    vd = p["value_linear.weight"].shape[1] // heads
    out = np.zeros((b, t, p["head_compose_linear.weight"].shape[1]))
    for bb in range(b):
        ln = int(mask[bb].sum())
        mem = memory[bb]
        if mix_forward_reverse:
            rev = np.concatenate([mem[:ln][::-1], np.zeros((s - ln, mem.shape[1]))])
            g = 1.0 / (1.0 + np.exp(-5.0 * (query[bb, 0] @ p["dir_gater.weight"][:, 0] + p["dir_gater.bias"][0])))
            mem = g * mem + (1 - g) * rev
        pre = mem @ p["value_transform.weight"] + p["value_transform.bias"]
        vals = np.where(pre > 0, pre, 0.01 * pre) @ p["value_linear.weight"]
        step = 1.0 / max(1, ln - 1)
        past = np.zeros(heads)
        for tt in range(t):
            qp = query[bb, tt] @ p["position_state_linear.weight"] + p["position_state_linear.bias"]
            heads_out, new_past = [], np.zeros(heads)
            for h in range(heads):
                qh = qp[h * d:(h + 1) * d]
                sig = (max(qh @ p["Wsigma"][h, :, 0], 0.0) + 0.27) / ln
                rho = qh @ p["Wrho"][h, :, 0]
                sb = 1.0 / (1.0 + np.exp(-p["step_bias"][0]))
                st = {"sigmoid": 1 / (1 + np.exp(-5 * rho)), "relu": max(rho, 0.0), "free": rho,
                      "softstair": np.floor(rho) + 1 / (1 + np.exp(-softstair_temp * (rho - np.floor(rho) - 0.5))),
                      "controlled_relu": sb * max(rho, 0.0) + (1 - sb) / (1 + np.exp(-5 * rho))}[step_act]
                mu = st * step + past[h]
                e = np.array([np.exp(-(j * step - mu) ** 2 / (2 * sig * sig)) * mask[bb, j] for j in range(s)])
                phi = e / np.sum(e + 1e-20)
                a = phi
                if mix_attention:
                    qc = (query[bb, tt] @ p["query_linear.weight"])[h * d:(h + 1) * d]
                    kc = (mem @ p["key_linear.weight"])[:, h * d:(h + 1) * d]
                    lg = np.where(mask[bb], kc @ qc / np.sqrt(d), -np.inf)
                    ca = np.exp(lg - lg.max())
                    ca = ca / ca.sum()
                    lam = 1.0 / (1.0 + np.exp(-(query[bb, tt] @ p["mix_scorer.weight"][:, 0] + p["mix_scorer.bias"][0])))
                    a = lam * phi + (1 - lam) * ca
                heads_out.append(a @ vals[:, h * vd:(h + 1) * vd])
                w = phi if (position_past or not mix_attention) else a
                new_past[h] = sum(w[j] * j * step for j in range(s))
            past = new_past
            out[bb, tt] = np.concatenate(heads_out) @ p["head_compose_linear.weight"]
    return out


def _check_every_step_activation_gradcheck(rng):
    # The generated FD test draws one configuration per seed: here the softstair step with the content
    # mix and position_past, through time (tests/test_softmax_s4.py runs every other activation, the mix
    # without position_past and the reversal).
    from ...testing import gradcheck
    return gradcheck(monotonic_location_forward, monotonic_location_backward,
                     _sample_cfg(rng, "tiny", "softstair", True, True)).max_rel


def _check_reversal_is_an_involution(rng):
    # Reversing within the valid length twice gives back the valid part; the gate at +-inf picks one copy.
    x = rng.standard_normal((3, 6, 2))
    lengths = np.array([6, 4, 1])
    back = reverse_within_length(reverse_within_length(x, lengths), lengths)
    valid = (np.arange(6)[None, :] < lengths[:, None])[..., None]
    err = float(np.abs(np.where(valid, back - x, 0.0)).max())
    brute = np.stack([np.concatenate([x[i, :n][::-1], np.zeros((6 - n, 2))]) for i, n in enumerate(lengths)])
    err = max(err, float(np.abs(reverse_within_length(x, lengths) - brute).max()))
    assert err == 0.0, err
    return err


def _check_location_weights_are_normalised(rng):
    # phi sums to 1 over the valid positions (up to the 1e-20 per position in the denominator) and
    # puts exactly no weight on padding.
    s = _sample_cfg(rng, "small", "sigmoid", False)
    _, c = monotonic_location_forward(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(c["phi"].sum(-1) - 1.0).max())
    assert err < 1e-12, err
    pad = ~s.config["memory_mask"]
    assert float(np.abs(np.where(pad[:, None, None, :], c["phi"], 0.0)).max()) == 0.0, "weight on padding"
    return err


register(
    Mechanism(
        slug="monotonic_location_attention", family="1-softmax", tier="T3",
        title="Monotonic location attention (OneStepAttn / MonoAttn) with forward-reverse mixing, backward through time",
        paper="Ray Chowdhury, Caragea, Monotonic Location Attention for Length Generalization, ICML 2023, "
              "arXiv 2305.20019",
        forward=monotonic_location_forward, backward=monotonic_location_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#monotonic-location-attention",
        checks={"every_step_activation_gradcheck": _check_every_step_activation_gradcheck,
                "reversal_is_an_involution": _check_reversal_is_an_involution,
                "location_weights_are_normalised": _check_location_weights_are_normalised},
    ),
)
