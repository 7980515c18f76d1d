r"""PINNsFormer: pseudo-sequences of collocation points, the Wavelet activation and the
encoder-decoder PINN transformer built from them.

Paper: Zhao, Ding, Prakash, "PINNsFormer: A Transformer-Based Framework For Physics-Informed
Neural Networks", ICLR 2024, arXiv 2307.11833. Upstream: AdityaLab/pinnsformer
``model/pinnsformer.py`` (``WaveAct``, ``FeedForward``, ``EncoderLayer``, ``DecoderLayer``,
``PINNsformer``) and ``util.py`` (``make_time_sequence``) @ 00d790f50c3f77599fbe263b9e8035f9860a1027.

Pseudo-sequence
---------------
A collocation point $(x, t)$ becomes the sequence $\{(x, t + k\Delta t)\}_{k=0}^{K-1}$
(``make_time_sequence(src, num_step=K, step=Δt)``, upstream defaults $K = 5$,
$\Delta t = 10^{-4}$); the model attends over these $K$ pseudo-time steps and the PINN loss is
applied to every step (the training recipe, not a layer, is not part of refattn).

Wavelet activation
------------------
$\mathrm{Wavelet}(x) = \omega_1\sin x + \omega_2\cos x$ with learnable scalars ($\omega = (1, 1)$
at initialisation); $= A\sin(x + \varphi)$ with $A = |\omega|$, $\varphi = \operatorname{atan2}(\omega_2,
\omega_1)$. It is a two-term Fourier feature, not a wavelet transform: there is no filter bank
and no reconstruction property to test. Backward: $\bar x = \bar y(\omega_1\cos x - \omega_2\sin x)$,
$\bar\omega_1 = \sum\bar y\sin x$, $\bar\omega_2 = \sum\bar y\cos x$.

Model (``PINNsformer``)
-----------------------
$s = [x, t]W_{emb} + b$; encoder layers $e \leftarrow e + \mathrm{MHA}(\mathrm{W}(e)) $,
$e \leftarrow e + \mathrm{FF}(\mathrm{W}(e))$, then a Wavelet; decoder layers on $d = s$:
$d \leftarrow d + \mathrm{MHA}(q = \mathrm{W}(d), kv = e)$, $d \leftarrow d + \mathrm{FF}(\mathrm{W}(d))$,
then a Wavelet; output MLP ``Linear, W, Linear, W, Linear``. $\mathrm{FF}$ = ``Linear, W, Linear,
W, Linear`` ($d_{ff} = 256$ upstream), MHA = ``nn.MultiheadAttention`` (scale $1/\sqrt{d_h}$, no
dropout). Every Wavelet has its own $\omega$. Layers are deep copies (independent parameters).

Backward
--------
Reverse mode through the residual stream: the MHA VJP is
:func:`refattn.attention.softmax.mha_backward` (self-attention: its three input gradients sum;
cross-attention: the key/value gradient flows into the encoder output), linears
:func:`refattn.nn.linear.linear_vjp`, Wavelets as above. The pseudo-sequence is affine in
$(x, t)$: the gradient of a point sums over its $K$ steps.

Conventions
-----------
* Parameters under upstream ``state_dict`` names with Linear weights transposed to ``(in, out)``:
  ``linear_emb.*``, ``encoder.layers.{i}.attn.in_proj_weight (d, 3d)`` (= ``in_proj_weight.T``),
  ``.attn.in_proj_bias``, ``.attn.out_proj.weight``/``.bias``, ``.ff.linear.{0,2,4}.weight``/
  ``.bias``, ``.ff.linear.{1,3}.w1``/``.w2``, ``.act1.w1`` … ``.act2.w2``, ``encoder.act.w1/w2``,
  the same under ``decoder.``, ``linear_out.{0,2,4}.*`` and ``linear_out.{1,3}.w1/w2``
  (each $\omega$ of shape ``(1,)``).
* ``num_step=None``: ``x``, ``t`` are sequences ``(N, K, 1)`` (upstream ``forward(x, t)``); an int:
  ``x``, ``t`` are points ``(N, 1)``, expanded by the pseudo-sequence generator with ``step``.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax import mha_backward, mha_forward, naive_attention
from ..nn.linear import init_torch_default, linear_apply, linear_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["make_time_sequence", "wave_activation_forward", "wave_activation_backward", "wave_activation",
           "pinnsformer_param_shapes", "pinnsformer_forward", "pinnsformer_backward", "pinnsformer",
           "init_pinnsformer_params"]


def make_time_sequence(src, num_step: int = 5, step: float = 1e-4) -> np.ndarray:
    r"""Pseudo-sequences ``(N, num_step, D)`` from points ``src (N, D)``: the last coordinate
    (time) advanced by ``k * step`` at position ``k`` (upstream ``util.make_time_sequence``)."""
    src = as_float(src, "src", ndim=2)
    num_step = check_int(num_step, "num_step", minimum=1)
    step = check_positive(step, "step", allow_zero=True)
    seq = np.repeat(src[:, None, :], num_step, axis=1)
    seq[:, :, -1] += step * np.arange(num_step, dtype=seq.dtype)
    return seq


def _wave(x, p, key):
    return p[f"{key}.w1"] * np.sin(x) + p[f"{key}.w2"] * np.cos(x)


def _wave_vjp(g, x, p, key, grads):
    s, c = np.sin(x), np.cos(x)
    grads[f"{key}.w1"] = np.reshape(np.sum(g * s), (1,))
    grads[f"{key}.w2"] = np.reshape(np.sum(g * c), (1,))
    return g * (p[f"{key}.w1"] * c - p[f"{key}.w2"] * s)


def wave_activation_forward(x, params):
    r"""$\omega_1\sin x + \omega_2\cos x$ (upstream ``WaveAct``); ``params = {"w1": (1,), "w2": (1,)}``."""
    x = as_float(x, "x", min_ndim=1)
    p = check_params(params, {"w1": (1,), "w2": (1,)}, where="wave_activation")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    return p["w1"] * np.sin(x) + p["w2"] * np.cos(x), {"x": x, "p": p, "dt": dt}


def wave_activation_backward(dout, cache):
    """Gradients ``{"x", "w1", "w2"}`` of :func:`wave_activation_forward`."""
    x, p = cache["x"], cache["p"]
    g = as_dout(dout, x.shape, cache["dt"])
    s, c = np.sin(x), np.cos(x)
    return {"x": g * (p["w1"] * c - p["w2"] * s), "w1": np.reshape(np.sum(g * s), (1,)),
            "w2": np.reshape(np.sum(g * c), (1,))}


def wave_activation(x, params) -> np.ndarray:
    """Convenience wrapper: the output of :func:`wave_activation_forward`."""
    return wave_activation_forward(x, params)[0]


def _mlp_keys(prefix):
    return [(f"{prefix}.0", "lin"), (f"{prefix}.1", "wave"), (f"{prefix}.2", "lin"), (f"{prefix}.3", "wave"),
            (f"{prefix}.4", "lin")]


def pinnsformer_param_shapes(d_model: int, num_layers: int = 1, *, d_ff: int = 256, d_hidden: int = 512,
                             d_out: int = 1, d_in: int = 2) -> dict:
    """``{key: shape}`` of a ``PINNsformer(d_out, d_model, d_hidden, N=num_layers, heads)``."""
    s = {"linear_emb.weight": (d_in, d_model), "linear_emb.bias": (d_model,)}
    wave = {"w1": (1,), "w2": (1,)}
    for part in ("encoder", "decoder"):
        for i in range(num_layers):
            pre = f"{part}.layers.{i}"
            s.update({f"{pre}.attn.in_proj_weight": (d_model, 3 * d_model), f"{pre}.attn.in_proj_bias": (3 * d_model,),
                      f"{pre}.attn.out_proj.weight": (d_model, d_model), f"{pre}.attn.out_proj.bias": (d_model,)})
            dims = [d_model, d_ff, d_ff, d_model]
            for j, (key, kind) in enumerate(_mlp_keys(f"{pre}.ff.linear")):
                if kind == "lin":
                    s.update({f"{key}.weight": (dims[j // 2], dims[j // 2 + 1]), f"{key}.bias": (dims[j // 2 + 1],)})
                else:
                    s.update({f"{key}.{w}": v for w, v in wave.items()})
            s.update({f"{pre}.{a}.{w}": v for a in ("act1", "act2") for w, v in wave.items()})
        s.update({f"{part}.act.{w}": v for w, v in wave.items()})
    dims = [d_model, d_hidden, d_hidden, d_out]
    for j, (key, kind) in enumerate(_mlp_keys("linear_out")):
        if kind == "lin":
            s.update({f"{key}.weight": (dims[j // 2], dims[j // 2 + 1]), f"{key}.bias": (dims[j // 2 + 1],)})
        else:
            s.update({f"{key}.{w}": v for w, v in wave.items()})
    return s


def _mlp(h, p, prefix, tape):
    for key, kind in _mlp_keys(prefix):
        tape.append((kind, key, h))
        h = linear_apply(h, p[f"{key}.weight"], p[f"{key}.bias"]) if kind == "lin" else _wave(h, p, key)
    return h


def _mlp_vjp(g, p, prefix, tape, grads):
    for kind, key, h in reversed(tape[-5:]):
        if kind == "lin":
            r = linear_vjp(g, h, p[f"{key}.weight"])
            grads[f"{key}.weight"], grads[f"{key}.bias"], g = r["weight"], r["bias"], r["x"]
        else:
            g = _wave_vjp(g, h, p, key, grads)
    del tape[-5:]
    return g


def _mha_params(p, pre):
    w, b, d = p[f"{pre}.attn.in_proj_weight"], p[f"{pre}.attn.in_proj_bias"], p[f"{pre}.attn.out_proj.weight"].shape[0]
    return {"q_proj": w[:, :d], "k_proj": w[:, d:2 * d], "v_proj": w[:, 2 * d:], "out_proj": p[f"{pre}.attn.out_proj.weight"],
            "q_proj_bias": b[:d], "k_proj_bias": b[d:2 * d], "v_proj_bias": b[2 * d:], "out_proj_bias": p[f"{pre}.attn.out_proj.bias"]}


def _layer(h, ctx, p, pre, heads, caches):
    a1 = _wave(h, p, f"{pre}.act1")
    att, ca = mha_forward(a1, ctx, _mha_params(p, pre), num_heads=heads)
    h2 = h + att
    a2 = _wave(h2, p, f"{pre}.act2")
    tape = []
    out = h2 + _mlp(a2, p, f"{pre}.ff.linear", tape)
    caches.append({"h": h, "h2": h2, "ca": ca, "tape": tape, "pre": pre})
    return out


def _layer_vjp(g, c, p, grads):
    pre = c["pre"]
    g2 = g + _wave_vjp(_mlp_vjp(g, p, f"{pre}.ff.linear", c["tape"], grads), c["h2"], p, f"{pre}.act2", grads)
    r = mha_backward(g2, c["ca"])
    grads[f"{pre}.attn.in_proj_weight"] = np.concatenate([r["q_proj"], r["k_proj"], r["v_proj"]], axis=1)
    grads[f"{pre}.attn.in_proj_bias"] = np.concatenate([r["q_proj_bias"], r["k_proj_bias"], r["v_proj_bias"]])
    grads[f"{pre}.attn.out_proj.weight"], grads[f"{pre}.attn.out_proj.bias"] = r["out_proj"], r["out_proj_bias"]
    gh = g2 + _wave_vjp(r["x"], c["h"], p, f"{pre}.act1", grads)
    return gh, r.get("context")


def _validate(x, t, params, num_heads, num_step, step):
    seq = num_step is None
    x = as_float(x, "x", ndim=3 if seq else 2)
    t = as_float(t, "t", ndim=3 if seq else 2)
    if x.shape != t.shape or x.shape[-1] != 1:
        raise ValueError(f"x and t must have the same shape {'(N, K, 1)' if seq else '(N, 1)'}; got x {x.shape}, "
                         f"t {t.shape}")
    heads = check_int(num_heads, "num_heads", minimum=1)
    if not seq:
        check_int(num_step, "num_step", minimum=1)
        check_positive(step, "step", allow_zero=True)
    if not isinstance(params, dict) or params.get("linear_emb.weight") is None:
        raise ValueError("params must be a dict with the PINNsformer weights (linear_emb.weight (2, d_model), ...)")
    d_model = as_float(params["linear_emb.weight"], "linear_emb.weight", ndim=2).shape[1]
    n_layers = 0
    while f"encoder.layers.{n_layers}.attn.in_proj_weight" in params:
        n_layers += 1
    ff0, out0, out4 = (params.get(k) for k in ("encoder.layers.0.ff.linear.0.weight", "linear_out.0.weight",
                                                 "linear_out.4.weight"))
    d_ff = as_float(ff0, "encoder.layers.0.ff.linear.0.weight", ndim=2).shape[1] if ff0 is not None else 256
    d_hidden = as_float(out0, "linear_out.0.weight", ndim=2).shape[1] if out0 is not None else 512
    d_out = as_float(out4, "linear_out.4.weight", ndim=2).shape[1] if out4 is not None else 1
    if n_layers < 1 or d_model % heads:
        raise ValueError(f"need >= 1 encoder layer and num_heads ({heads}) dividing d_model ({d_model}); got "
                         f"{n_layers} layers")
    p = check_params(params, pinnsformer_param_shapes(d_model, n_layers, d_ff=d_ff, d_hidden=d_hidden, d_out=d_out),
                     where="pinnsformer")
    dt = compute_dtype(x, t, *p.values())
    return x.astype(dt, copy=False), t.astype(dt, copy=False), cast_all(dt, p), heads, n_layers, dt


def pinnsformer_forward(x, t, params, *, num_heads: int = 2, num_step=None, step: float = 1e-4):
    r"""PINNsFormer (upstream ``PINNsformer.forward(x, t)``; module docstring).

    Parameters
    ----------
    x, t : arrays (N, K, 1), or (N, 1) with ``num_step``
        Space and time coordinates of the pseudo-sequences (or of the points).
    params : dict
        :func:`pinnsformer_param_shapes` keys (upstream names, Linear weights as ``(in, out)``).
    num_heads : int
        Attention heads (upstream ``heads``).
    num_step : int, optional
        Expand points into pseudo-sequences of this length first (:func:`make_time_sequence`).
    step : float
        The pseudo-time increment $\Delta t$ (upstream default ``1e-4``).

    Returns
    -------
    out, cache
        ``out (N, K, d_out)``.
    """
    x, t, p, heads, n_layers, dt = _validate(x, t, params, num_heads, num_step, step)
    if num_step is not None:
        x = np.repeat(x[:, None], num_step, axis=1)
        t = make_time_sequence(t, num_step, step)
    src = linear_apply(np.concatenate([x, t], axis=-1), p["linear_emb.weight"], p["linear_emb.bias"])
    enc, dec = [], []
    e = src
    for i in range(n_layers):
        e = _layer(e, None, p, f"encoder.layers.{i}", heads, enc)
    e_pre, e = e, _wave(e, p, "encoder.act")
    d = src
    for i in range(n_layers):
        d = _layer(d, e, p, f"decoder.layers.{i}", heads, dec)
    d_pre = d
    tape = []
    out = _mlp(_wave(d, p, "decoder.act"), p, "linear_out", tape)
    cache = {"p": p, "src_in": np.concatenate([x, t], axis=-1), "enc": enc, "dec": dec, "e_pre": e_pre, "d_pre": d_pre,
             "tape": tape, "points": num_step is not None, "shape": out.shape, "dt": dt}
    return out, cache


def pinnsformer_backward(dout, cache):
    """Gradients of :func:`pinnsformer_forward`: ``x``, ``t`` and every parameter."""
    p, grads = cache["p"], {}
    g = as_dout(dout, cache["shape"], cache["dt"])
    tape = list(cache["tape"])
    g = _mlp_vjp(g, p, "linear_out", tape, grads)
    gd = _wave_vjp(g, cache["d_pre"], p, "decoder.act", grads)
    ge = 0.0
    for c in reversed(cache["dec"]):
        gd, gctx = _layer_vjp(gd, dict(c, tape=list(c["tape"])), p, grads)
        ge = ge + gctx
    gs = gd
    ge = _wave_vjp(ge, cache["e_pre"], p, "encoder.act", grads)
    for c in reversed(cache["enc"]):
        ge, _ = _layer_vjp(ge, dict(c, tape=list(c["tape"])), p, grads)
    gs = gs + ge
    r = linear_vjp(gs, cache["src_in"], p["linear_emb.weight"])
    grads["linear_emb.weight"], grads["linear_emb.bias"] = r["weight"], r["bias"]
    gx, gt = r["x"][..., :1], r["x"][..., 1:]
    if cache["points"]:
        gx, gt = gx.sum(axis=1), gt.sum(axis=1)
    grads["x"], grads["t"] = gx, gt
    return grads


def pinnsformer(x, t, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`pinnsformer_forward`."""
    return pinnsformer_forward(x, t, params, **config)[0]


def init_pinnsformer_params(rng, d_model: int = 32, num_layers: int = 1, *, d_ff: int = 256, d_hidden: int = 512,
                            d_out: int = 1, dtype=np.float64) -> dict:
    """PyTorch-default initialisation: Linear $U(\\pm1/\\sqrt{\\text{in}})$ weights and biases,
    ``nn.MultiheadAttention``'s xavier-uniform ``in_proj_weight`` and zero in/out biases, $\\omega = (1, 1)$."""
    shapes = pinnsformer_param_shapes(d_model, num_layers, d_ff=d_ff, d_hidden=d_hidden, d_out=d_out)
    p = init_torch_default(rng, shapes, ones=(".w1", ".w2"))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, d, heads, ff, hid, layers, steps = 2, 2, 1, 2, 2, 1, 3
    else:
        n, d, heads, ff, hid, layers, steps = 3, 4, 2, 6, 5, 2, 4
    p = init_pinnsformer_params(rng, d, layers, d_ff=ff, d_hidden=hid, d_out=2)
    # parameters moved well off their initialisation and pseudo-steps far apart, so that no
    # parameter's gradient is tiny compared with finite-difference noise
    # (tiny only: the wider small model is already well conditioned at 0.3 and chaotic at 0.8)
    noise = 0.8 if size == "tiny" else 0.3
    p = {k: v + noise * rng.standard_normal(v.shape) for k, v in p.items()}
    return Sample(inputs={"x": rng.uniform(-1, 1, (n, 1)), "t": rng.uniform(0, 1, (n, 1))}, params=p,
                  config={"num_heads": heads, "num_step": steps, "step": 0.5})


def _reference(x, t, params, *, num_heads=2, num_step=None, step=1e-4):
    # The upstream module sequence with attention as explicit per-head loops (naive_attention).
    p = params
    if num_step is not None:
        src = make_time_sequence(np.concatenate([x, t], -1), num_step, step)
    else:
        src = np.concatenate([x, t], -1)
    wave = lambda h, k: p[f"{k}.w1"] * np.sin(h) + p[f"{k}.w2"] * np.cos(h)     # noqa: E731

    def mlp(h, pre):
        for j in range(5):
            h = h @ p[f"{pre}.{j}.weight"] + p[f"{pre}.{j}.bias"] if j % 2 == 0 else wave(h, f"{pre}.{j}")
        return h

    def mha(q_in, kv_in, pre):
        w, b = p[f"{pre}.attn.in_proj_weight"], p[f"{pre}.attn.in_proj_bias"]
        d = w.shape[0]
        split = lambda a: a.reshape(a.shape[0], a.shape[1], num_heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = (split(z @ w[:, i * d:(i + 1) * d] + b[i * d:(i + 1) * d]) for i, z in enumerate((q_in, kv_in, kv_in)))
        o = naive_attention(q, k, v).transpose(0, 2, 1, 3).reshape(q_in.shape)
        return o @ p[f"{pre}.attn.out_proj.weight"] + p[f"{pre}.attn.out_proj.bias"]

    s = src @ p["linear_emb.weight"] + p["linear_emb.bias"]
    n_layers = sum(1 for k in p if k.endswith("attn.in_proj_weight") and k.startswith("encoder"))
    e = s
    for i in range(n_layers):
        pre = f"encoder.layers.{i}"
        a = wave(e, f"{pre}.act1")
        e = e + mha(a, a, pre)
        e = e + mlp(wave(e, f"{pre}.act2"), f"{pre}.ff.linear")
    e = wave(e, "encoder.act")
    d = s
    for i in range(n_layers):
        pre = f"decoder.layers.{i}"
        d = d + mha(wave(d, f"{pre}.act1"), e, pre)
        d = d + mlp(wave(d, f"{pre}.act2"), f"{pre}.ff.linear")
    return mlp(wave(d, "decoder.act"), "linear_out")


def _check_pseudo_sequence(rng):
    # The generator advances only time, by k * step, and the model on generated points equals the
    # model on the explicit sequences.
    pts = rng.uniform(0, 1, (4, 2))
    seq = make_time_sequence(pts, 5, 1e-4)
    expect = np.stack([np.stack([pts[:, 0], pts[:, 1] + k * 1e-4], -1) for k in range(5)], axis=1)
    err = float(np.abs(seq - expect).max())
    s = _sample(rng, "small")
    a = pinnsformer(**s.inputs, params=s.params, **s.config)
    k = s.config["num_step"]
    xs = np.repeat(s.inputs["x"][:, None], k, axis=1)
    ts = make_time_sequence(s.inputs["t"], k, s.config["step"])
    b = pinnsformer(xs, ts, s.params, num_heads=s.config["num_heads"])
    err = max(err, float(np.abs(a - b).max()))
    assert err < 1e-15, f"pseudo-sequence generation is off by {err:.2e}"
    return err


def _check_wavelet_is_shifted_sine(rng):
    # omega_1 sin x + omega_2 cos x = |omega| sin(x + atan2(omega_2, omega_1)); omega = (1, 0) is sin.
    x = rng.uniform(-5, 5, 50)
    w1, w2 = rng.standard_normal(2)
    y = wave_activation(x, {"w1": np.array([w1]), "w2": np.array([w2])})
    err = float(np.abs(y - np.hypot(w1, w2) * np.sin(x + np.arctan2(w2, w1))).max())
    err = max(err, float(np.abs(wave_activation(x, {"w1": np.ones(1), "w2": np.zeros(1)}) - np.sin(x)).max()))
    assert err < 1e-14, f"Wavelet activation is not the shifted sine: {err:.2e}"
    return err


def _sample_wave(rng, size):
    shape = (2, 3) if size == "tiny" else (3, 5, 4)
    return Sample(inputs={"x": rng.uniform(-3, 3, shape)}, params={"w1": rng.standard_normal(1), "w2": rng.standard_normal(1)})


register(
    Mechanism(
        slug="pinnsformer_wavelet_pseudosequence", family="3-operator", tier="T2",
        title="PINNsFormer: pseudo-sequences of collocation points and the Wavelet-activated encoder-decoder",
        paper="Zhao, Ding, Prakash, PINNsFormer: A Transformer-Based Framework For Physics-Informed Neural Networks, "
              "ICLR 2024, arXiv 2307.11833",
        forward=pinnsformer_forward, backward=pinnsformer_backward, sample=_sample, reference=_reference,
        docs="operators/convolutional-and-wavelet-operators.md#pinnsformer",
        checks={"pseudo_sequence": _check_pseudo_sequence, "wavelet_is_shifted_sine": _check_wavelet_is_shifted_sine},
    ),
    Mechanism(
        slug="wavelet_activation", family="3-operator", tier="primitive",
        title="PINNsFormer's Wavelet activation w1 sin(x) + w2 cos(x) with learnable w",
        paper="Zhao, Ding, Prakash, PINNsFormer, ICLR 2024, arXiv 2307.11833",
        official_code="AdityaLab/pinnsformer",
        forward=wave_activation_forward, backward=wave_activation_backward, sample=_sample_wave,
        docs="operators/convolutional-and-wavelet-operators.md#pinnsformer",
    ),
)
