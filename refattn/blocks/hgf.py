r"""Hybrid Gated Flow: a ternary (1.58-bit) linear layer plus a gated low-rank full-precision correction.

Trejo Pizzo, "Hybrid Gated Flow (HGF): Stabilizing 1.58-bit LLMs via Selective Low-Rank
Correction", arXiv 2602.05269 (2026). No code is public (no repository under the author's name
holds it). The sources available here are the abstract and a secondary summary of the method; the
layer below implements what they state and marks the rest "reconstruction".

What the sources define
-----------------------
HGF replaces a Transformer projection by two parallel paths: a ternary-weight backbone (BitNet
b1.58's 1.58-bit weights) and a learnable low-rank FP16 correction, fused with a learned scalar
gate — one scalar per projection (Q, K, V, O) — whose trained value settles near $g\approx0.1$
(the paper describes a gate warm-up, regularisation and freeze schedule, which is training
procedure, not layer math). For $x\in\mathbb R^{\dots\times C_{in}}$:

$$\hat W = \gamma\,\mathrm{clip}\big(\mathrm{round}(W/\gamma), -1, 1\big),\quad
\gamma = \max\big(\tfrac1{|W|}\textstyle\sum|W_{ij}|, \epsilon_q\big),\qquad
y = x\hat W + b + g\,(xA)B,$$

with the latent weight $W$ (``weight``, $(C_{in}, C_{out})$), the absmean scale and quantiser of
BitNet b1.58 ($\epsilon_q = 10^{-5}$, torch's round-half-to-even), the rank-$r$ factors
$A$ (``lora_A.weight``, $(C_{in}, r)$) and $B$ (``lora_B.weight``, $(r, C_{out})$), the optional
bias $b$ and the gate parameter $\theta$ (``gate``, shape ``(1,)``).

Reconstruction choices (keywords): ``gate_activation="identity"`` ($g = \theta$; the summary
reports gate values directly) or ``"sigmoid"`` ($g = \sigma(\theta)$); the activations are not
quantised (BitNet's 8-bit absmax activation quantiser and its RMSNorm are not stated for HGF);
``estimator`` below.

Backward and the straight-through estimator
-------------------------------------------
The rounding makes $\hat W$ piecewise constant in $W$ except through $\gamma$. With
$G = \sum_{\text{rows}} x^\top dy$ ($= \partial L/\partial\hat W$), $u = dy\,B^\top$:

$$dx = dy\,\hat W^\top + g\,u\,A^\top,\quad dA = g\sum x^\top u,\quad dB = g\sum (xA)^\top dy,\quad
db = \textstyle\sum dy,\quad d\theta = \sum dy\odot (xA)B\cdot\{1, \sigma'(\theta)\}.$$

The latent weight's gradient is the estimator's:

* ``estimator="ste"`` (default; BitNet b1.58's ``w + (quant(w) - w).detach()``, the
  straight-through estimator HGF inherits): $dW = G$ — the gradient with respect to $\hat W$
  passed through the quantiser unchanged;
* ``estimator="fixed"``: the exact derivative of the forward with the ternary codes
  $q = \mathrm{clip}(\mathrm{round}(W/\gamma))$ held fixed, $dW = \mathrm{sign}(W)/|W|\cdot
  \sum_{ij}G_{ij}q_{ij}$ (only $\gamma$ moves; zero where the clamp $\epsilon_q$ is active).
  Finite differences check this mode (the registry sample uses it, away from rounding ties and
  $W_{ij} = 0$); the named check ``ste_equals_its_chain`` checks that the STE gradient is the
  gradient with respect to the quantised weight.

Agreement with upstream
-----------------------
No upstream code exists. A float64 torch transcription (``weight + (quant(weight) -
weight).detach()`` for the STE; for ``"fixed"``, the codes computed under ``no_grad`` times the
differentiable absmean) agrees with the forward and every gradient to $7.2\times10^{-16}$
relative, both estimators and both gate activations.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, check_weight_in
from ..registry import Mechanism, Sample, register

__all__ = ["hgf_linear_forward", "hgf_linear_backward", "hgf_linear", "ternary_quantize", "HGF_ESTIMATORS",
           "HGF_GATE_ACTIVATIONS"]

HGF_ESTIMATORS = ("ste", "fixed")
HGF_GATE_ACTIVATIONS = ("identity", "sigmoid")


def ternary_quantize(w, *, eps: float = 1e-5):
    r"""BitNet b1.58's absmean quantiser: returns $(\hat W, q, \gamma)$ with
    $\gamma = \max(\mathrm{mean}|W|, \epsilon)$, $q = \mathrm{clip}(\mathrm{round}(W/\gamma), -1, 1)$,
    $\hat W = \gamma q$ (``np.round`` rounds half to even, as ``torch.round``)."""
    w = as_float(w, "w")
    gamma = max(float(np.mean(np.abs(w))), float(eps))
    q = np.clip(np.round(w / gamma), -1.0, 1.0)
    return (gamma * q).astype(w.dtype, copy=False), q.astype(w.dtype, copy=False), gamma


def hgf_linear_forward(x, params, *, gate_activation: str = "identity", estimator: str = "ste",
                       quant_eps: float = 1e-5):
    r"""HGF projection $y = x\hat W + b + g\,(xA)B$ (module docstring).

    Parameters
    ----------
    x : array (..., C_in)
    params : dict
        ``"weight" (C_in, C_out)`` (the latent full-precision weight), optional ``"bias" (C_out,)``,
        ``"lora_A.weight" (C_in, r)``, ``"lora_B.weight" (r, C_out)``, ``"gate" (1,)``.
    gate_activation : {"identity", "sigmoid"}
    estimator : {"ste", "fixed"}
        The latent weight's gradient (module docstring).
    quant_eps : float
        The absmean clamp $\epsilon_q$.

    Returns
    -------
    y, cache
    """
    x = as_float(x, "x", min_ndim=1)
    check_choice(gate_activation, "gate_activation", HGF_GATE_ACTIVATIONS)
    check_choice(estimator, "estimator", HGF_ESTIMATORS)
    quant_eps = check_positive(quant_eps, "quant_eps")
    if not isinstance(params, dict):
        raise TypeError(f"params for hgf_linear must be a dict of arrays; got {type(params).__name__}")
    for key in ("weight", "lora_A.weight"):
        if params.get(key) is None:
            raise ValueError(f"params is missing key {key!r} for hgf_linear")
    w0 = as_float(params["weight"], "weight", ndim=2)
    a0 = as_float(params["lora_A.weight"], "lora_A.weight", ndim=2)
    if w0.shape[0] != x.shape[-1] == w0.shape[1]:  # reads as PyTorch's (out, in): name the transpose
        check_weight_in(params, "weight", x.shape[-1], input_name="x")
    c_in, c_out = w0.shape
    if x.shape[-1] != c_in:
        raise ValueError(f"x's last axis ({x.shape[-1]}) must equal weight's input width C_in={c_in} "
                         f"(weight is (C_in, C_out) = {w0.shape})")
    r = a0.shape[1]
    spec = {"weight": (c_in, c_out), "bias": (c_out,), "lora_A.weight": (c_in, r), "lora_B.weight": (r, c_out),
            "gate": (1,)}
    p = check_params(params, spec, optional=["bias"], where="hgf_linear")
    dt = np.result_type(x.dtype, *(v.dtype for v in p.values()))
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    w_hat, q, gamma = ternary_quantize(p["weight"], eps=quant_eps)
    theta = p["gate"][0]
    g = theta if gate_activation == "identity" else 0.5 * (1.0 + np.tanh(0.5 * theta))
    h = x @ p["lora_A.weight"]
    corr = h @ p["lora_B.weight"]
    y = x @ w_hat + g * corr
    if "bias" in p:
        y = y + p["bias"]
    cache = {"x": x, "p": p, "w_hat": w_hat, "q": q, "clamped": bool(np.mean(np.abs(p["weight"])) < quant_eps),
             "h": h, "corr": corr, "g": g, "gate_activation": gate_activation, "estimator": estimator,
             "dtype": dt, "shape": y.shape}
    return y, cache


def hgf_linear_backward(dout, cache):
    r"""Gradients of `hgf_linear_forward` for ``x`` and every params key; the latent weight's
    through the chosen estimator (module docstring)."""
    g_out = as_dout(dout, cache["shape"], cache["dtype"])
    x, p, g = cache["x"], cache["p"], cache["g"]
    c_in = x.shape[-1]
    x2 = x.reshape(-1, c_in)
    dy2 = g_out.reshape(-1, g_out.shape[-1])
    big_g = x2.T @ dy2
    u = dy2 @ p["lora_B.weight"].T
    grads = {"x": (dy2 @ cache["w_hat"].T + g * (u @ p["lora_A.weight"].T)).reshape(x.shape),
             "lora_A.weight": g * (x2.T @ u), "lora_B.weight": g * (cache["h"].reshape(-1, u.shape[1]).T @ dy2)}
    if "bias" in p:
        grads["bias"] = dy2.sum(axis=0)
    dg = np.sum(g_out * cache["corr"])
    if cache["gate_activation"] == "sigmoid":
        dg = dg * g * (1.0 - g)
    grads["gate"] = np.full(1, dg, dtype=cache["dtype"])
    if cache["estimator"] == "ste":
        grads["weight"] = big_g
    elif cache["clamped"]:
        grads["weight"] = np.zeros_like(big_g)
    else:
        w = p["weight"]
        grads["weight"] = np.sign(w) / w.size * np.sum(big_g * cache["q"])
    return grads


def hgf_linear(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `hgf_linear_forward`."""
    return hgf_linear_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c_in, c_out, r, bias=True):
    while True:
        w = rng.standard_normal((c_in, c_out)) / np.sqrt(c_in)
        t = np.abs(w) / np.mean(np.abs(w))
        # Away from the rounding ties |W|/gamma = 0.5 and from W = 0 (sign kink), so that finite
        # differences of size 1e-6 see the codes fixed.
        if np.min(np.abs(t - 0.5)) > 0.05 and np.min(np.abs(w)) > 0.02:
            break
    p = {"weight": w, "lora_A.weight": rng.standard_normal((c_in, r)) / np.sqrt(c_in),
         "lora_B.weight": rng.standard_normal((r, c_out)) / np.sqrt(r), "gate": np.array([0.1 + 0.3 * rng.random()])}
    if bias:
        p["bias"] = 0.1 * rng.standard_normal(c_out)
    return p


def _sample(rng, size):
    c_in, c_out, r, n = (4, 3, 2, 2) if size == "tiny" else (8, 6, 3, int(rng.integers(3, 6)))
    p = _params(rng, c_in, c_out, r, bias=bool(rng.random() < 0.7))
    return Sample(inputs={"x": rng.standard_normal((2, n, c_in))}, params=p,
                  config={"gate_activation": str(rng.choice(HGF_GATE_ACTIVATIONS)), "estimator": "fixed"})


def _reference(x, params, gate_activation="identity", estimator="ste", quant_eps=1e-5):
    # Entry by entry: the absmean scale, the ternary code of every weight, then both paths.
    w = params["weight"]
    gamma = max(sum(abs(v) for v in w.ravel()) / w.size, quant_eps)
    w_hat = np.zeros_like(w)
    for idx, v in np.ndenumerate(w):
        w_hat[idx] = gamma * min(1.0, max(-1.0, float(np.round(v / gamma))))
    theta = float(params["gate"][0])
    g = theta if gate_activation == "identity" else 1.0 / (1.0 + np.exp(-theta))
    y = x @ w_hat + g * ((x @ params["lora_A.weight"]) @ params["lora_B.weight"])
    return y + params.get("bias", 0.0)


def _check_ternary_codes(rng):
    # The codes are in {-1, 0, 1}, W_hat = gamma q, the scale is the absmean, and every code is the
    # nearest of {-1, 0, 1} to W / gamma (brute force over the three levels).
    w = rng.standard_normal((16, 12)) * 0.3
    w_hat, q, gamma = ternary_quantize(w)
    levels = np.array([-1.0, 0.0, 1.0])
    nearest = levels[np.argmin(np.abs(w[..., None] / gamma - levels), axis=-1)]
    err = max(float(np.abs(w_hat - gamma * q).max()), abs(gamma - float(np.mean(np.abs(w)))))
    assert set(np.unique(q)) <= {-1.0, 0.0, 1.0} and np.array_equal(q, nearest) and err < 1e-15, err
    assert ternary_quantize(np.zeros((2, 2)))[2] == 1e-5
    return err


def _check_ste_equals_its_chain(rng):
    # The STE weight gradient is the gradient with respect to the quantised weight: for a random
    # direction V, <dW_ste, V> = d/de L(x, W_hat + e V) (the layer with W_hat replaced, central
    # differences); the other gradients equal the "fixed" estimator's.
    s = _sample(rng, "small")
    x, p = s.inputs["x"], s.params
    cfg = dict(s.config, estimator="ste")
    y, cache = hgf_linear_forward(x, p, **cfg)
    dy = rng.standard_normal(y.shape)
    g_ste = hgf_linear_backward(dy, cache)
    g_fix = hgf_linear_backward(dy, hgf_linear_forward(x, p, **dict(cfg, estimator="fixed"))[1])
    v = rng.standard_normal(p["weight"].shape)
    w_hat = ternary_quantize(p["weight"])[0]
    eps = 1e-6
    fd = (np.sum(dy * (x @ (w_hat + eps * v))) - np.sum(dy * (x @ (w_hat - eps * v)))) / (2 * eps)
    err = abs(fd - float(np.sum(g_ste["weight"] * v))) / max(1.0, abs(fd))
    err = max([err] + [float(np.abs(g_ste[k] - g_fix[k]).max()) for k in g_ste if k != "weight"])
    assert err < 1e-8, f"STE gradient vs its chain: {err}"
    return err


def _check_zero_gate_is_bitlinear(rng):
    # gate = 0 (identity gate): the layer is the ternary linear layer and the factors get no gradient.
    s = _sample(rng, "small")
    p = dict(s.params, gate=np.zeros(1))
    cfg = dict(s.config, gate_activation="identity")
    y, cache = hgf_linear_forward(s.inputs["x"], p, **cfg)
    g = hgf_linear_backward(np.ones_like(y), cache)
    ref = s.inputs["x"] @ ternary_quantize(p["weight"])[0] + p.get("bias", 0.0)
    err = max(float(np.abs(y - ref).max()), float(np.abs(g["lora_A.weight"]).max()),
              float(np.abs(g["lora_B.weight"]).max()))
    assert err < 1e-13, err
    return err


register(
    Mechanism(
        slug="hybrid_gated_flow_ternary", family="5-building-blocks", tier="T3",
        title="Hybrid Gated Flow projection: ternary (BitNet b1.58) weights plus a scalar-gated low-rank "
              "full-precision correction, straight-through or fixed-code weight gradient",
        paper="Trejo Pizzo, Hybrid Gated Flow (HGF): Stabilizing 1.58-bit LLMs via Selective Low-Rank Correction, "
              "arXiv 2602.05269 (2026)",
        forward=hgf_linear_forward, backward=hgf_linear_backward, sample=_sample, reference=_reference,
        docs="blocks/b7.md#hybrid_gated_flow_ternary",
        checks={"ternary_codes": _check_ternary_codes, "ste_equals_its_chain": _check_ste_equals_its_chain,
                "zero_gate_is_bitlinear": _check_zero_gate_is_bitlinear},
    ),
)
