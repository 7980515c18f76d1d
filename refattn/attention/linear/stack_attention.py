r"""Stack attention, superposition variant: a differentiable stack (Joulin & Mikolov) driven by
per-token push/pop/no-op probabilities, read at the top after every step.

DuSell & Chiang, "Stack Attention: Improving the Ability of Transformers to Model Hierarchical
Patterns", ICLR 2024, arXiv 2310.01749. Upstream read (and run against this module in float64):
``bdusell/stack-attention src/stack_attention/superposition.py``,
``src/stack_attention/stack_attention.py`` and ``src/stack_rnn_models/joulin_mikolov.py``
(``JoulinMikolovStack.next_elements``) @244167afa71ebfaf9edcfa891b235ef44d694e20.
The nondeterministic (dVPDA, $O(n^3)$) variant of the paper is not provided here.

Forward
-------
For $x\in\mathbb R^{B\times L\times d}$, with bias-free linear layers (upstream's parameter names):
$a_t = \mathrm{softmax}(x_tW_a)$ with components (push, pop, no-op) in that order
(``action_layer``), $v_t = x_tW_v\in\mathbb R^m$ (``input_to_pushed_vector_layer``, no
activation), and the stack $S_t\in\mathbb R^{H\times m}$, $S_0 = 0$:

$$S_t[0] = a^{push}_t v_t + a^{noop}_t S_{t-1}[0] + a^{pop}_t S_{t-1}[1],$$
$$S_t[i] = a^{push}_t S_{t-1}[i-1] + a^{noop}_t S_{t-1}[i] + a^{pop}_t S_{t-1}[i+1]\quad(i\ge 1),$$

entries beyond the stack being zero. Output $y_t = S_t[0]\,W_o$ (``stack_reading_to_output_layer``)
for $t = 1..L$ (upstream ``include_first=False``). A stack of height $H = L$ is exact: upstream
trims elements that can no longer reach the top before the sequence ends (height
$\min(t, L+1-t)$), which leaves every reading unchanged.

Backward (through time)
-----------------------
$dS_t[0] \mathrel{+}= dy_tW_o^\top$; going backwards, with $P = S_{t-1}$:
$da^{push}_t = \langle dS_t[0], v_t\rangle + \sum_{i\ge1}\langle dS_t[i], P[i-1]\rangle$,
$da^{noop}_t = \sum_i\langle dS_t[i], P[i]\rangle$, $da^{pop}_t = \sum_i\langle dS_t[i], P[i+1]\rangle$,
$dv_t = a^{push}_t dS_t[0]$, and
$dS_{t-1}[j] = a^{push}_t dS_t[j+1] + a^{noop}_t dS_t[j] + a^{pop}_t dS_t[j-1]$ ($j\ge1$ for the last
term). Then the softmax VJP (`refattn.nn.softmax.softmax_vjp`) and the linear VJPs. Cost
$O(L^2m)$ time and memory (the stack is stored at every step).

Measured agreement with upstream (float64, CPU, ``SuperpositionStackAttention(6, 4)`` run from
the repository's ``src`` with ``include_first=False``, weights copied): $L=17$, batch 3: output
max abs error 1.1e-16 (rel 1.8e-16); gradients of ``x`` and the three weights max rel 8.0e-16.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_weight_in, weight_shape_hint
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...nn.softmax import softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel

__all__ = ["superposition_stack_forward", "stack_attention_forward", "stack_attention_backward", "stack_attention"]

_A, _V, _O = "action_layer.linear", "input_to_pushed_vector_layer.linear", "stack_reading_to_output_layer.linear"


def superposition_stack_forward(actions: np.ndarray, pushed: np.ndarray) -> np.ndarray:
    r"""All stacks $S_0..S_L$ ``(B, L+1, L, m)`` of the superposition stack for action
    probabilities ``actions (B, L, 3)`` (push, pop, no-op) and pushed vectors ``pushed (B, L, m)``.
    Unvalidated."""
    B, L, m = pushed.shape
    S = np.zeros((B, L + 1, L, m), dtype=pushed.dtype)
    for t in range(L):
        P = S[:, t]
        push, pop, noop = (actions[:, t, i][:, None, None] for i in range(3))
        nxt = noop * P
        nxt[:, 1:] += push * P[:, :-1]
        nxt[:, 0] += push[:, 0] * pushed[:, t]
        nxt[:, :-1] += pop * P[:, 1:]
        S[:, t + 1] = nxt
    return S


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def stack_attention_forward(x, params):
    r"""Superposition stack attention (``SuperpositionStackAttention``) on ``x (B, L, d)``;
    ``params``: ``action_layer.linear.weight`` ``(d, 3)``,
    ``input_to_pushed_vector_layer.linear.weight`` ``(d, m)``,
    ``stack_reading_to_output_layer.linear.weight`` ``(m, d)`` (torch ``weight.T``).
    Returns ``(y (B, L, d), cache)``."""
    x = as_float(x, "x", ndim=3)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    d = x.shape[-1]
    for key in (_A, _V, _O):
        if f"{key}.weight" not in params:
            raise ValueError(f"params is missing '{key}.weight'")
    p = {k: as_float(v, k) for k, v in params.items()}
    wa, wv, wo = p[f"{_A}.weight"], p[f"{_V}.weight"], p[f"{_O}.weight"]
    if wa.shape != (d, 3):
        raise ValueError(f"params['{_A}.weight'] must have shape ({d}, 3); got {wa.shape}"
                         f"{weight_shape_hint('weight', wa.shape, (d, 3))}")
    if wv.ndim == 2:  # m is read off its output axis
        check_weight_in(p, f"{_V}.weight", d, input_name="x")
    if wv.ndim != 2 or wv.shape[0] != d:
        raise ValueError(f"params['{_V}.weight'] must have shape ({d}, m); got {wv.shape}")
    if wo.shape != (wv.shape[1], d):
        raise ValueError(f"params['{_O}.weight'] must have shape ({wv.shape[1]}, {d}); got {wo.shape}"
                         f"{weight_shape_hint('weight', wo.shape, (wv.shape[1], d))}")
    dt = x.dtype
    p = {k: v.astype(dt, copy=False) for k, v in p.items()}
    a = _softmax(linear_prefixed(p, _A, x))
    v = linear_prefixed(p, _V, x)
    S = superposition_stack_forward(a, v)
    r = S[:, 1:, 0]
    y = linear_prefixed(p, _O, r)
    return y, {"p": p, "x": x, "a": a, "v": v, "S": S, "r": r, "dtype": dt, "shape": y.shape}


def stack_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`stack_attention_forward` w.r.t. ``x`` and the three weights."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    p, a, v, S = cache["p"], cache["a"], cache["v"], cache["S"]
    grads: dict = {}
    dr = linear_prefixed_vjp(grads, p, _O, dout, cache["r"])
    B, L, m = v.shape
    da = np.zeros_like(a)
    dv = np.zeros_like(v)
    dS = np.zeros((B, L, m), dtype=dt)
    for t in reversed(range(L)):
        dS[:, 0] += dr[:, t]
        P = S[:, t]
        push, pop, noop = (a[:, t, i][:, None, None] for i in range(3))
        da[:, t, 0] = np.sum(dS[:, 0] * v[:, t], axis=-1) + np.sum(dS[:, 1:] * P[:, :-1], axis=(1, 2))
        da[:, t, 2] = np.sum(dS * P, axis=(1, 2))
        da[:, t, 1] = np.sum(dS[:, :-1] * P[:, 1:], axis=(1, 2))
        dv[:, t] = push[:, 0] * dS[:, 0]
        prev = noop * dS
        prev[:, :-1] += push * dS[:, 1:]
        prev[:, 1:] += pop * dS[:, :-1]
        dS = prev
    dlogits = softmax_vjp(a, da)
    x = cache["x"]
    dx = linear_prefixed_vjp(grads, p, _A, dlogits, x) + linear_prefixed_vjp(grads, p, _V, dv, x)
    out = {"x": dx}
    out.update({k: np.asarray(g, dtype=dt) for k, g in grads.items()})
    return out


def stack_attention(x, params) -> np.ndarray:
    """Convenience wrapper: the output of :func:`stack_attention_forward`."""
    return stack_attention_forward(x, params)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference_stack(x, params):
    """Explicit form: the stack as Python lists of element vectors, updated element by element."""
    B, L, _ = x.shape
    a = _softmax(x @ params[f"{_A}.weight"])
    v = x @ params[f"{_V}.weight"]
    out = []
    for b in range(B):
        stack: list = []
        rows = []
        for t in range(L):
            push, pop, noop = a[b, t]
            old = stack + [np.zeros_like(v[b, t])] * 2
            new = []
            for i in range(len(stack) + 1):
                above = v[b, t] if i == 0 else old[i - 1]
                new.append(push * above + noop * old[i] + pop * old[i + 1])
            stack = new
            rows.append(stack[0] @ params[f"{_O}.weight"])
        out.append(rows)
    return np.array(out)


def _sample_stack(rng, size):
    d, m, L = (3, 2, 5) if size == "tiny" else (6, 4, 10)
    p = {f"{_A}.weight": rng.standard_normal((d, 3)), f"{_V}.weight": rng.standard_normal((d, m)) / np.sqrt(d),
         f"{_O}.weight": rng.standard_normal((m, d)) / np.sqrt(m)}
    return Sample(inputs={"x": rng.standard_normal((2, L, d))}, params=p)


def _check_one_hot_actions_are_a_discrete_stack(rng):
    """Saturated (one-hot) actions reproduce a discrete push/pop stack (pop of an empty stack reads 0)."""
    L, m = 9, 3
    ops = rng.integers(0, 3, (1, L))
    a = np.eye(3)[ops]
    v = rng.standard_normal((1, L, m))
    S = superposition_stack_forward(a, v)
    stack: list = []
    err = 0.0
    for t in range(L):
        if ops[0, t] == 0:
            stack.insert(0, v[0, t])
        elif ops[0, t] == 1 and stack:
            stack.pop(0)
        top = stack[0] if stack else np.zeros(m)
        err = max(err, float(np.max(np.abs(S[0, t + 1, 0] - top))))
    assert err == 0.0, err
    return err


def _check_stack_fd_longer(rng):
    s = _sample_stack(rng, "tiny")
    s = Sample(inputs={"x": rng.standard_normal((2, 8, 3))}, params=s.params)
    err = fd_max_rel(stack_attention_forward, stack_attention_backward, s)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="stack_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Stack attention (superposition stack)",
        paper="DuSell & Chiang, 'Stack Attention: Improving the Ability of Transformers to Model Hierarchical "
              "Patterns', ICLR 2024, arXiv 2310.01749",
        official_code="bdusell/stack-attention src/stack_attention/superposition.py"
                      "@244167afa71ebfaf9edcfa891b235ef44d694e20",
        forward=stack_attention_forward, backward=stack_attention_backward, sample=_sample_stack,
        reference=_reference_stack,
        checks={"one_hot_actions_are_a_discrete_stack": _check_one_hot_actions_are_a_discrete_stack,
                "gradcheck_longer_sequence": _check_stack_fd_longer},
        docs="linear/long-convolutions-and-memory.md#stack-attention",
    ),
)
