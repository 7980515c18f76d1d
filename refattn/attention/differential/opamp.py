r"""OpAmp attention: a differential plus a common-mode term with a finite CMRR, via adapters.

Wu, Ming, Zheng, He, Yu, "Efficient OpAmp Adaptation for Zoom Attention to Golden Contexts",
ACL 2025, arXiv 2502.12502. No official code is public (checked: no repository is named by the
paper or found by search); this module follows the paper's §2 (eq. 1, the op-amp model and the
adapter placement), and every choice the paper leaves open is a keyword marked *reconstruction*.

Forward
-------
DIFF attention is a differential amplifier: only the differential gain $A_d$ acts, an infinite
common-mode rejection ratio (CMRR). An operational amplifier also passes the common mode:

$$\bar M = A_d\,(M^+ - M^-) + \frac{A_c}{2}\,(M^+ + M^-),\qquad \mathcal K = A_d / A_c ,$$

with $M^\pm$ two softmax maps. The paper fixes $A_c = 1$ and sets the CMRR $\mathcal K$ (best
$\mathcal K = 10$), so $\bar M = a\,M^+ + b\,M^-$ with $a = A_c(\mathcal K + \tfrac12)$,
$b = A_c(\tfrac12 - \mathcal K)$; its rows sum to $a + b = A_c$. The two maps come from one
pretrained projection each for queries and keys, followed by two adapters (paper eq. 1,
$E(h) = \phi(hW_1)W_2 + h$):

$$Q_i = E^i_q(XW^q),\quad K_i = E^i_k(XW^k),\quad M^+ = \mathrm{softmax}(sQ_1K_1^\top + M),\quad
M^- = \mathrm{softmax}(sQ_2K_2^\top + M),$$

$$O = \bar M\,V,\ V = XW^v,\qquad \mathrm{out} = \mathrm{merge}(O)\,W^o ,$$

per head ($s = d^{-1/2}$, causal mask by default as in the decoder LLMs the paper adapts;
grouped K/V heads repeated contiguously as HF ``repeat_kv``). With $W_2 = 0$ (the paper's
initialisation) $M^+ = M^- = M$ and $\bar M = A_cM$: the pretrained attention.

Backward (derivation)
---------------------
$G = \partial L/\partial\,\mathrm{out}$: $dW^o = \mathrm{merge}(O)^\top G$, $dO = $ split heads of
$GW^{o\top}$; $dV = \bar M^\top dO$ and $d\bar M = dO\,V^\top$, so $dM^+ = a\,d\bar M$,
$dM^- = b\,d\bar M$; each softmax VJP $dS = M(dM - \mathrm{rowsum}(M\odot dM))$ gives
$dQ_i = s\,dS_iK_i$, $dK_i = s\,dS_i^\top Q_i$ (K heads summed back over their query heads).
Adapter $E(h) = \phi(hW_1)W_2 + h$ with $z = hW_1$: $dW_2 = \phi(z)^\top g$,
$dz = (gW_2^\top)\odot\phi'(z)$, $dW_1 = h^\top dz$, $dh = g + dz\,W_1^\top$. Both adapters of a
projection add into $d(XW^q)$ (resp. $XW^k$), and $dX$ sums the three projections' VJPs.

Reconstruction (keywords)
-------------------------
* ``adapter_activation`` $\phi$ — the paper writes a generic non-linearity; default ``"silu"``
  (smooth; ``"gelu"`` and ``"relu"`` available).
* Adapters act on the whole projected width (all heads at once, $d_1 = H\,d$), without biases
  (eq. 1 has none); parameter keys ``adapter_q1.down.weight (H d, r)``,
  ``adapter_q1.up.weight (r, H d)`` ... ``adapter_k2``; the projections use the HF Llama/Qwen
  names ``q_proj/k_proj/v_proj/o_proj`` (optional biases, Qwen has q/k/v biases).
* RoPE is not applied (where the adapters sit relative to RoPE is not stated); ``is_causal``
  (default True), ``attn_mask``, ``scale``, ``cmrr`` (default 10) and ``common_gain`` $A_c$
  (default 1) are keywords.

Measured agreement: no upstream code exists; a torch float64 transcription of the formulas above
(autograd for the gradients; B=2, N=6, C=8, H=4, H_kv=2, d=3, r=2, CMRR 10, SiLU and GELU) agrees
to 1.8e-14 max abs on the output (entries of order 10: $a = 10.5$, $b = -9.5$) and <= 2.9e-15 max
rel on every gradient (``docs/differential/t3.md#opamp_attention``).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_weight_in,
    compute_dtype,
)
from ...nn.activations import gelu, gelu_grad, relu, relu_grad, silu, silu_grad
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import (
    additive_mask,
    gather_heads,
    kv_head_index,
    resolve_scale,
    scatter_heads,
    softmax_map_backward,
    softmax_map_forward,
)

__all__ = [
    "ADAPTER_NAMES",
    "opamp_attention_forward",
    "opamp_attention_backward",
    "opamp_attention",
    "opamp_gains",
]

ADAPTER_NAMES = ("adapter_q1", "adapter_q2", "adapter_k1", "adapter_k2")
_ACT = {"silu": (silu, silu_grad), "gelu": (gelu, gelu_grad), "relu": (relu, relu_grad)}


def opamp_gains(cmrr: float = 10.0, common_gain: float = 1.0) -> tuple[float, float]:
    r"""The weights $(a, b)$ of $\bar M = aM^+ + bM^-$: $a = A_c(\mathcal K + \frac12)$,
    $b = A_c(\frac12 - \mathcal K)$ with $A_d = \mathcal K A_c$."""
    for name, val in (("cmrr", cmrr), ("common_gain", common_gain)):
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, float, np.number)) or not np.isfinite(val):
            raise TypeError(f"{name} must be a finite real number; got {val!r}")
    a_d = float(cmrr) * float(common_gain)
    return a_d + 0.5 * float(common_gain), 0.5 * float(common_gain) - a_d


def _validate(x, params, num_heads, num_kv_heads, adapter_activation):
    x = as_float(x, "x", ndim=3)
    h = check_int(num_heads, "num_heads", minimum=1)
    hkv = h if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if h % hkv:
        raise ValueError(f"num_heads must be a multiple of num_kv_heads; got {h} and {hkv}")
    check_choice(adapter_activation, "adapter_activation", tuple(_ACT))
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    for key in ("q_proj.weight", "o_proj.weight", "adapter_q1.down.weight"):
        if key not in params:
            raise ValueError(f"params is missing {key!r} (OpAmp keys: q/k/v/o_proj, adapter_q1/q2/k1/k2.down/up)")
    c = x.shape[2]
    check_weight_in(params, "q_proj.weight", c, input_name="x")
    wq = as_float(params["q_proj.weight"], "q_proj.weight", ndim=2)
    if wq.shape[0] != c or wq.shape[1] % h:
        raise ValueError(f"q_proj.weight must have shape (C={c}, num_heads * head_dim) with num_heads={h}; got {wq.shape}")
    d = wq.shape[1] // h
    check_weight_in(params, "o_proj.weight", h * d, input_name=f"the merged heads ({h} x {d})")
    c_out = as_float(params["o_proj.weight"], "o_proj.weight", ndim=2).shape[1]
    check_weight_in(params, "adapter_q1.down.weight", h * d, input_name=f"the query heads ({h} x {d})")
    r = as_float(params["adapter_q1.down.weight"], "adapter_q1.down.weight", ndim=2).shape[1]
    spec = {**linear_prefixed_spec("q_proj", c, h * d), **linear_prefixed_spec("k_proj", c, hkv * d),
            **linear_prefixed_spec("v_proj", c, hkv * d), **linear_prefixed_spec("o_proj", h * d, c_out)}
    for name in ADAPTER_NAMES:
        width = h * d if name.startswith("adapter_q") else hkv * d
        spec[f"{name}.down.weight"] = (width, r)
        spec[f"{name}.up.weight"] = (r, width)
    optional = tuple(f"{p}.bias" for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    p = check_params(params, spec, optional=optional, where="opamp_attention")
    dt = compute_dtype(x, *p.values())
    arrays = cast_all(dt, {"x": x, **p})
    return arrays.pop("x"), arrays, h, hkv, d


def _adapter(p, name, hid, act):
    z = hid @ p[f"{name}.down.weight"]
    return act(z) @ p[f"{name}.up.weight"] + hid, z


def _adapter_vjp(grads, p, name, g, hid, z, act, act_grad):
    grads[f"{name}.up.weight"] = act(z).reshape(-1, z.shape[-1]).T @ g.reshape(-1, g.shape[-1])
    dz = (g @ p[f"{name}.up.weight"].T) * act_grad(z)
    grads[f"{name}.down.weight"] = hid.reshape(-1, hid.shape[-1]).T @ dz.reshape(-1, dz.shape[-1])
    return g + dz @ p[f"{name}.down.weight"].T


def opamp_attention_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None, cmrr: float = 10.0,
                            common_gain: float = 1.0, adapter_activation: str = "silu", is_causal: bool = True,
                            attn_mask=None, scale=None):
    r"""OpAmp attention layer $\mathrm{out} = \mathrm{merge}\bigl((aM^+ + bM^-)V\bigr)W^o$ (module docstring).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``q_proj.weight (C, H d)``, ``k_proj.weight``/``v_proj.weight (C, H_kv d)``,
        ``o_proj.weight (H d, C_out)`` (optional ``*.bias``), and the four adapters
        ``adapter_{q1,q2,k1,k2}.down.weight (width, r)`` / ``.up.weight (r, width)``.
    num_heads, num_kv_heads : int
        Query heads and key/value heads (GQA, contiguous groups; default ``num_heads``).
    cmrr, common_gain : float
        $\mathcal K = A_d/A_c$ (paper's best 10) and $A_c$ (paper: 1).
    adapter_activation : {"silu", "gelu", "relu"}
        The adapters' $\phi$ (reconstruction; default ``"silu"``).
    is_causal, attn_mask, scale
        Causal mask (default True), extra bool/additive mask broadcastable to ``(B, H, N, N)``,
        softmax scale (default $d^{-1/2}$).

    Returns
    -------
    out (B, N, C_out), cache
    """
    x, p, h, hkv, d = _validate(x, params, num_heads, num_kv_heads, adapter_activation)
    a, b = opamp_gains(cmrr, common_gain)
    s = resolve_scale(scale, d)
    n = x.shape[1]
    mask = additive_mask(attn_mask, is_causal, (x.shape[0], h, n, n))
    act, _ = _ACT[adapter_activation]
    q, k = linear_prefixed(p, "q_proj", x), linear_prefixed(p, "k_proj", x)
    v = linear_prefixed(p, "v_proj", x)
    idx = kv_head_index(h, hkv)
    hs, zs, maps = {}, {}, []
    for i in ("1", "2"):
        qi, zs["adapter_q" + i] = _adapter(p, "adapter_q" + i, q, act)
        ki, zs["adapter_k" + i] = _adapter(p, "adapter_k" + i, k, act)
        hs["q" + i], hs["k" + i] = split_heads(qi, h), gather_heads(split_heads(ki, hkv), idx)
        maps.append(softmax_map_forward(hs["q" + i], hs["k" + i], mask, s))
    mbar = a * maps[0] + b * maps[1]
    vh = gather_heads(split_heads(v, hkv), idx)
    o = merge_heads(mbar @ vh)
    out = linear_prefixed(p, "o_proj", o)
    cache = dict(x=x, p=p, q=q, k=k, hs=hs, zs=zs, maps=maps, mbar=mbar, vh=vh, o=o, a=a, b=b, s=s, h=h,
                 hkv=hkv, idx=idx, act=adapter_activation, out_shape=out.shape)
    return out, cache


def opamp_attention_backward(dout, cache):
    """Gradients of :func:`opamp_attention_forward` for ``x`` and every parameter (module docstring)."""
    x, p, h, hkv, idx = cache["x"], cache["p"], cache["h"], cache["hkv"], cache["idx"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    act, act_grad = _ACT[cache["act"]]
    grads = {}
    do = split_heads(linear_prefixed_vjp(grads, p, "o_proj", g, cache["o"]), h)
    dv = merge_heads(scatter_heads(np.swapaxes(cache["mbar"], -1, -2) @ do, idx, hkv))
    dmbar = do @ np.swapaxes(cache["vh"], -1, -2)
    dq = np.zeros_like(cache["q"])
    dk = np.zeros_like(cache["k"])
    for i, w, pm in (("1", cache["a"], cache["maps"][0]), ("2", cache["b"], cache["maps"][1])):
        dqi, dki, _ = softmax_map_backward(w * dmbar, pm, cache["hs"]["q" + i], cache["hs"]["k" + i], cache["s"])
        dq += _adapter_vjp(grads, p, "adapter_q" + i, merge_heads(dqi), cache["q"], cache["zs"]["adapter_q" + i],
                           act, act_grad)
        dk += _adapter_vjp(grads, p, "adapter_k" + i, merge_heads(scatter_heads(dki, idx, hkv)), cache["k"],
                           cache["zs"]["adapter_k" + i], act, act_grad)
    dx = linear_prefixed_vjp(grads, p, "q_proj", dq, x)
    dx = dx + linear_prefixed_vjp(grads, p, "k_proj", dk, x)
    dx = dx + linear_prefixed_vjp(grads, p, "v_proj", dv, x)
    return {"x": dx, **grads}


def opamp_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`opamp_attention_forward`."""
    return opamp_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, h, hkv, d, r, bias=False, zero_up=False):
    p = {"q_proj.weight": rng.standard_normal((c, h * d)) / np.sqrt(c),
         "k_proj.weight": rng.standard_normal((c, hkv * d)) / np.sqrt(c),
         "v_proj.weight": rng.standard_normal((c, hkv * d)) / np.sqrt(c),
         "o_proj.weight": rng.standard_normal((h * d, c)) / np.sqrt(h * d)}
    if bias:
        for key in ("q_proj", "k_proj", "v_proj"):
            p[f"{key}.bias"] = 0.1 * rng.standard_normal(p[f"{key}.weight"].shape[1])
    for name in ADAPTER_NAMES:
        width = h * d if name.startswith("adapter_q") else hkv * d
        p[f"{name}.down.weight"] = rng.standard_normal((width, r)) / np.sqrt(width)
        p[f"{name}.up.weight"] = np.zeros((r, width)) if zero_up else 0.5 * rng.standard_normal((r, width))
    return p


def _sample(rng, size):
    if size == "tiny":
        b, n, c, h, hkv, d, r = 2, 3, 2, 2, 1, 1, 1
    else:
        b, n, c, h, hkv, d, r = 2, int(rng.integers(4, 8)), 6, 4, 2, 3, 2
    return Sample(inputs={"x": rng.standard_normal((b, n, c))},
                  params=_params(rng, c, h, hkv, d, r, bias=bool(rng.integers(2))),
                  config={"num_heads": h, "num_kv_heads": hkv, "cmrr": float(rng.choice([1.0, 10.0])),
                          "adapter_activation": str(rng.choice(["silu", "gelu"])),
                          "is_causal": bool(rng.integers(2))})


def _reference(x, params, *, num_heads, num_kv_heads=None, cmrr=10.0, common_gain=1.0, adapter_activation="silu",
               is_causal=True, attn_mask=None, scale=None):
    # Per batch, per head, per query: the op-amp combination written out with explicit softmaxes.
    act = _ACT[adapter_activation][0]
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    d = params["q_proj.weight"].shape[1] // num_heads
    s = 1.0 / np.sqrt(d) if scale is None else scale

    def proj(key):
        return x @ params[key + ".weight"] + params.get(key + ".bias", 0.0)

    def adapt(name, hid):
        return act(hid @ params[name + ".down.weight"]) @ params[name + ".up.weight"] + hid

    q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
    qs = [adapt("adapter_q1", q), adapt("adapter_q2", q)]
    ks = [adapt("adapter_k1", k), adapt("adapter_k2", k)]
    a_d = cmrr * common_gain
    bt, n, _ = x.shape
    o = np.zeros((bt, n, num_heads * d))
    for bi in range(bt):
        for hh in range(num_heads):
            g = hh // (num_heads // hkv)
            qsl, ksl = slice(hh * d, (hh + 1) * d), slice(g * d, (g + 1) * d)
            for i in range(n):
                m = []
                for qa, ka in zip(qs, ks):
                    sc = np.array([s * qa[bi, i, qsl] @ ka[bi, j, ksl] for j in range(n)])
                    if is_causal:
                        sc[i + 1:] = -np.inf
                    e = np.exp(sc - sc.max())
                    m.append(e / e.sum())
                mbar = a_d * (m[0] - m[1]) + 0.5 * common_gain * (m[0] + m[1])
                o[bi, i, qsl] = mbar @ v[bi, :, ksl]
    return o @ params["o_proj.weight"] + params.get("o_proj.bias", 0.0)


def _check_zero_init_is_pretrained(rng):
    # Zero-initialised adapter up-projections: M+ = M- = M and the layer is A_c x plain attention.
    b, n, c, h, hkv, d, r = 2, 5, 6, 4, 2, 3, 2
    p = _params(rng, c, h, hkv, d, r, zero_up=True)
    x = rng.standard_normal((b, n, c))
    out = opamp_attention(x, p, num_heads=h, num_kv_heads=hkv, cmrr=10.0, common_gain=1.3)
    q = split_heads(x @ p["q_proj.weight"], h)
    idx = kv_head_index(h, hkv)
    k = gather_heads(split_heads(x @ p["k_proj.weight"], hkv), idx)
    v = gather_heads(split_heads(x @ p["v_proj.weight"], hkv), idx)
    pm = softmax_map_forward(q, k, additive_mask(None, True, (b, h, n, n)), 1 / np.sqrt(d))
    want = 1.3 * merge_heads(pm @ v) @ p["o_proj.weight"]
    err = float(np.abs(out - want).max())
    assert err < 1e-12, f"zero-initialised adapters do not give A_c x the pretrained attention ({err:.2e})"
    return err


def _check_rows_sum_to_common_gain(rng):
    # Rows of M-bar sum to a + b = A_c: with V = 1 (all-ones value projection output) every head gives A_c.
    b, n, c, h, d, r = 2, 5, 4, 2, 2, 2
    p = _params(rng, c, h, h, d, r)
    x = rng.standard_normal((b, n, c))
    _, cache = opamp_attention_forward(x, p, num_heads=h, cmrr=7.0, common_gain=0.8)
    err = float(np.abs(cache["mbar"].sum(axis=-1) - 0.8).max())
    assert err < 1e-12, f"rows of the op-amp map do not sum to A_c ({err:.2e})"
    return err


def _check_diff_limit(rng):
    # A_c -> 0 with A_d fixed is DIFF attention M+ - M-: cmrr = A_d / A_c, common_gain = A_c.
    b, n, c, h, d, r = 2, 4, 4, 2, 2, 2
    p = _params(rng, c, h, h, d, r)
    x = rng.standard_normal((b, n, c))
    _, cache = opamp_attention_forward(x, p, num_heads=h, cmrr=1e12, common_gain=1e-12)
    err = float(np.abs(cache["mbar"] - (cache["maps"][0] - cache["maps"][1])).max())
    assert err < 1e-10, f"infinite-CMRR limit is not DIFF attention ({err:.2e})"
    return err


register(
    Mechanism(
        slug="opamp_attention", family="2-differential", tier="T3",
        title="OpAmp adaptation (finite common-mode rejection)",
        paper="Wu, Ming, Zheng, He, Yu, 'Efficient OpAmp Adaptation for Zoom Attention to Golden Contexts', "
              "ACL 2025, arXiv 2502.12502",
        forward=opamp_attention_forward, backward=opamp_attention_backward, sample=_sample, reference=_reference,
        docs="differential/t3.md#opamp_attention",
        checks={"zero_init_is_pretrained": _check_zero_init_is_pretrained,
                "rows_sum_to_common_gain": _check_rows_sum_to_common_gain, "diff_limit": _check_diff_limit},
    ),
)
