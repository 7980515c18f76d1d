r"""GLU-family feed-forward layers: GLU, Bilinear, ReGLU, GEGLU, SwiGLU (Shazeer 2020).

Shazeer, "GLU Variants Improve Transformer", arXiv 2002.05202 (2020). The paper gives the
formulas and no code; the parameter names follow the LLaMA / Hugging Face ``LlamaMLP`` layout
(``gate_proj``, ``up_proj``, ``down_proj``), the de-facto layout of released SwiGLU checkpoints.

Forward
-------
With gate $W$ (``gate_proj``), value $V$ (``up_proj``) and output $W_2$ (``down_proj``), all
``(in, out)`` (PyTorch ``weight.T``), and an activation $\phi$:

$$\mathrm{FFN}_\phi(x) = \big(\phi(xW + b_W)\odot(xV + b_V)\big)W_2 + b_2.$$

The paper's variants are the choice of $\phi$ (``variant``): ``"glu"`` $\sigma$ (Dauphin et al.),
``"bilinear"`` the identity, ``"reglu"`` ReLU, ``"geglu"`` GELU, ``"swiglu"`` Swish$_1$ = SiLU.
The paper has no biases (``FFN_{GEGLU}(x, W, V, W_2)``); they are optional keys here.

The catalogue also lists a paper [1-44] that replaces self-attention by a GLU-gated MLP. Its
abstract does not say whether that MLP mixes tokens or channels; the simplest reading (channel
mixing, i.e. this FFN in the attention slot) is what a block gets when it is passed
``attention="glu_swiglu_ffn"`` (reconstruction; shown in ``tests/test_blocks_b1.py``).

Backward
--------
With $a = xW + b_W$, $v = xV + b_V$, $h = \phi(a)\odot v$ and $g = \partial L/\partial y$:

$$dh = gW_2^\top,\quad dW_2 = h^\top g,\quad da = dh\odot v\odot\phi'(a),\quad dv = dh\odot\phi(a),$$
$$dW = x^\top da,\quad dV = x^\top dv,\quad dx = da\,W^\top + dv\,V^\top,$$

biases summing $g$, $da$, $dv$ over the rows; $\phi'$ from `refattn.nn.activations`.

Conventions
-----------
``variant`` (``"swiglu"``), ``approximate`` (GEGLU's GELU: ``"none"`` exact, PyTorch default; T5
v1.1's ``gelu_new`` is ``"tanh"``), ``names`` (the three prefixes; ``("wi_0", "wi_1", "wo")`` loads
a T5 v1.1 ``DenseGatedActDense``). ReGLU's derivative at $a = 0$ is 0 (PyTorch).

Agreement with upstream
-----------------------
A float64 PyTorch transcription of the paper's five formulas with ``nn.Linear`` layers (which is
``LlamaMLP.forward``, ``down_proj(act(gate_proj(x)) * up_proj(x))``, for SwiGLU) agrees with the
output and every gradient (``x``, all three weights and biases) to $4.2\times10^{-16}$ relative for
every variant, with and without biases.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad, relu, relu_grad, sigmoid, sigmoid_grad, silu, silu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .core import param_dim

__all__ = ["glu_ffn_forward", "glu_ffn_backward", "glu_ffn", "glu_activation", "GLU_VARIANTS", "LLAMA_MLP_NAMES"]

GLU_VARIANTS = ("glu", "bilinear", "reglu", "geglu", "swiglu")
LLAMA_MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


def glu_activation(variant: str, approximate: str = "none"):
    r"""``(phi, phi')`` of a GLU variant: sigmoid, identity, ReLU, GELU (``approximate``) or SiLU."""
    check_choice(variant, "variant", GLU_VARIANTS)
    check_choice(approximate, "approximate", ("none", "tanh"))
    if variant == "glu":
        return sigmoid, sigmoid_grad
    if variant == "bilinear":
        return (lambda a: a), (lambda a: np.ones_like(a))
    if variant == "reglu":
        return relu, relu_grad
    if variant == "geglu":
        return (lambda a: gelu(a, approximate)), (lambda a: gelu_grad(a, approximate))
    return silu, silu_grad


def _validate_names(names):
    if not (isinstance(names, (tuple, list)) and len(names) == 3 and all(isinstance(n, str) and n for n in names)):
        raise TypeError(f"names must be three non-empty strings (gate, value, output prefixes); got {names!r}")
    if len(set(names)) != 3:
        raise ValueError(f"names must be three distinct prefixes; got {names!r}")
    return tuple(names)


def glu_ffn_forward(x, params, *, variant: str = "swiglu", approximate: str = "none", names=LLAMA_MLP_NAMES):
    r"""$y = (\phi(xW)\odot xV)W_2$ (+ optional biases) over the last axis (module docstring).

    Parameters
    ----------
    x : array (..., C)
    params : dict
        ``"gate_proj.weight" (C, F)``, ``"up_proj.weight" (C, F)``, ``"down_proj.weight" (F, C_out)``
        and optional ``".bias"`` entries (prefixes from ``names``).
    variant : {"glu", "bilinear", "reglu", "geglu", "swiglu"}
    approximate : {"none", "tanh"}
        GELU form of GEGLU.
    names : tuple of 3 str
        Prefixes of the gate, value and output layers (``LLAMA_MLP_NAMES``).

    Returns
    -------
    y, cache
        ``y`` of shape ``(..., C_out)``.
    """
    x = as_float(x, "x", min_ndim=1)
    gate, up, down = _validate_names(names)
    phi, dphi = glu_activation(variant, approximate)
    c = x.shape[-1]
    f = param_dim(params, f"{gate}.weight", 1, where="glu_ffn", shape=("C", "F"))
    c_out = param_dim(params, f"{down}.weight", 1, where="glu_ffn", shape=("F", "C_out"))
    spec = linear_prefixed_spec(gate, c, f)
    spec.update(linear_prefixed_spec(up, c, f))
    spec.update(linear_prefixed_spec(down, f, c_out))
    p = check_params(params, spec, optional=[k for k in spec if k.endswith(".bias")], where="glu_ffn")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    a = linear_prefixed(p, gate, x)
    v = linear_prefixed(p, up, x)
    pa = phi(a)
    h = pa * v
    y = linear_prefixed(p, down, h)
    return y, {"x": x, "p": p, "a": a, "v": v, "pa": pa, "h": h, "dphi": dphi, "names": (gate, up, down),
               "shape": y.shape}


def glu_ffn_backward(dout, cache):
    r"""Gradients of `glu_ffn_forward` for ``x`` and every weight and given bias (module docstring)."""
    x, p, a, v, pa, h = (cache[k] for k in ("x", "p", "a", "v", "pa", "h"))
    gate, up, down = cache["names"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    dh = linear_prefixed_vjp(grads, p, down, g, h)
    dx = linear_prefixed_vjp(grads, p, gate, dh * v * cache["dphi"](a), x)
    grads["x"] = dx + linear_prefixed_vjp(grads, p, up, dh * pa, x)
    return grads


def glu_ffn(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `glu_ffn_forward`."""
    return glu_ffn_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, f, c_out=None, bias=True, names=LLAMA_MLP_NAMES):
    c_out = c if c_out is None else c_out
    gate, up, down = names
    p = {f"{gate}.weight": rng.standard_normal((c, f)) / np.sqrt(c),
         f"{up}.weight": rng.standard_normal((c, f)) / np.sqrt(c),
         f"{down}.weight": rng.standard_normal((f, c_out)) / np.sqrt(f)}
    if bias:
        p.update({f"{gate}.bias": 0.3 * rng.standard_normal(f), f"{up}.bias": 0.3 * rng.standard_normal(f),
                  f"{down}.bias": 0.1 * rng.standard_normal(c_out)})
    return p


def _sample(rng, size):
    variant = str(rng.choice(GLU_VARIANTS))
    if size == "tiny":
        n, c, f = int(rng.integers(2, 4)), 3, 3
    else:
        n, c, f = int(rng.integers(4, 7)), 6, 10
    bias = bool(rng.random() < 0.7)
    while True:
        x = rng.standard_normal((2, n, c))
        p = _params(rng, c, f, bias=bias)
        a = x @ p["gate_proj.weight"] + p.get("gate_proj.bias", 0.0)
        # ReGLU: keep the gate pre-activations off the ReLU kink at 0 (FD stencil).
        if variant != "reglu" or np.abs(a).min() > 0.05:
            break
    cfg = {"variant": variant}
    if variant == "geglu":
        cfg["approximate"] = str(rng.choice(["none", "tanh"]))
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _reference(x, params, variant="swiglu", approximate="none", names=LLAMA_MLP_NAMES):
    # The paper's formulas written with einsum and the activations spelled out.
    from scipy.special import erf

    gate, up, down = names
    a = np.einsum("...c,cf->...f", x, params[f"{gate}.weight"]) + params.get(f"{gate}.bias", 0.0)
    v = np.einsum("...c,cf->...f", x, params[f"{up}.weight"]) + params.get(f"{up}.bias", 0.0)
    if variant == "glu":
        pa = 1.0 / (1.0 + np.exp(-a))
    elif variant == "bilinear":
        pa = a
    elif variant == "reglu":
        pa = np.where(a > 0, a, 0.0)
    elif variant == "geglu":
        pa = (0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3))) if approximate == "tanh"
              else 0.5 * a * (1 + erf(a / np.sqrt(2))))
    else:
        pa = a / (1.0 + np.exp(-a))
    return np.einsum("...f,fo->...o", pa * v, params[f"{down}.weight"]) + params.get(f"{down}.bias", 0.0)


def _check_swiglu_ones_is_silu_mlp(rng):
    # The catalogue identity: SwiGLU with the value path fixed to ones (V = 0, b_V = 1) is the
    # SiLU MLP down(silu(gate(x))).
    x = rng.standard_normal((2, 4, 5))
    p = _params(rng, 5, 7)
    p["up_proj.weight"] = np.zeros((5, 7))
    p["up_proj.bias"] = np.ones(7)
    y = glu_ffn(x, p)
    ref = silu(x @ p["gate_proj.weight"] + p["gate_proj.bias"]) @ p["down_proj.weight"] + p["down_proj.bias"]
    err = float(np.abs(y - ref).max())
    assert err < 1e-14, f"SwiGLU with unit value path differs from the SiLU MLP by {err}"
    return err


def _check_swiglu_matches_activation_primitive(rng):
    # The FFN is refattn.nn.activations.swiglu applied to the fused [gate | up] projection.
    from ..nn.activations import swiglu

    x = rng.standard_normal((2, 3, 4))
    p = _params(rng, 4, 6, bias=False)
    fused = x @ np.concatenate([p["gate_proj.weight"], p["up_proj.weight"]], axis=1)
    err = float(np.abs(glu_ffn(x, p) - swiglu(fused) @ p["down_proj.weight"]).max())
    assert err < 1e-14, f"SwiGLU FFN differs from the fused activation primitive by {err}"
    return err


def _check_t5_names(rng):
    # names=("wi_0", "wi_1", "wo") is the same layer under T5 v1.1's keys.
    x = rng.standard_normal((2, 3, 4))
    p = _params(rng, 4, 5, bias=False)
    t5 = {"wi_0.weight": p["gate_proj.weight"], "wi_1.weight": p["up_proj.weight"], "wo.weight": p["down_proj.weight"]}
    y1 = glu_ffn(x, p, variant="geglu", approximate="tanh")
    y2 = glu_ffn(x, t5, variant="geglu", approximate="tanh", names=("wi_0", "wi_1", "wo"))
    err = float(np.abs(y1 - y2).max())
    assert err == 0.0, f"renamed layer differs by {err}"
    return err


register(
    Mechanism(
        slug="glu_swiglu_ffn", family="5-building-blocks", tier="T2",
        title="GLU-family FFN (GLU, Bilinear, ReGLU, GEGLU, SwiGLU), LLaMA gate/up/down layout",
        paper="Shazeer, GLU Variants Improve Transformer, arXiv 2002.05202 (2020)",
        forward=glu_ffn_forward, backward=glu_ffn_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#glu-family-feed-forward",
        checks={"swiglu_unit_value_is_silu_mlp": _check_swiglu_ones_is_silu_mlp,
                "swiglu_matches_activation_primitive": _check_swiglu_matches_activation_primitive,
                "t5_names": _check_t5_names},
    ),
)
