r"""Multi-Token Attention: key–query convolution over the score map, head mixing, RMS "group norm", gating.

Per layer, every stage switched on by the presence of its parameter: a pre-softmax key–query
convolution of the scores, pre-softmax head mixing, softmax, a post-softmax convolution, a grouped
head convolution or full head mix, $O_h = A'_hV_h$, RMSNorm over the head width and an output
gate. DIFF attention is a special case: a post-softmax head convolution with $c_h = 2$ and
$K = \begin{pmatrix}1 & \cdot\\ -\lambda & \cdot\end{pmatrix}$ gives $A'_1 = A_1 - \lambda A_2$.

Backward: every stage's VJP in reverse order; the convolutions' adjoints are transposed
convolutions of the padded correlation (derivation in `multi_token_attention_forward`).

The full layer (`multi_token_attention_layer_forward`) is upstream's ``Attention`` with
``use_mta``: bias-free projections ``wq``/``wk``/``wv``, interleaved RoPE on queries and keys
(lingua ``apply_rotary_emb``), the core with unrepeated GQA keys/values, heads merged, ``wo``.

GQA: the core takes ``k``, ``v`` with $H_{kv}$ heads ($H_{kv}$ divides $H$) and repeats them as
lingua's ``repeat_kv`` does (query head $h$ reads kv head $\lfloor h/r\rfloor$); the backward
returns their gradients on the $H_{kv}$ heads, each the sum over the $r$ query heads that read it.

Paper: O. Golovneva, T. Wang, J. Weston, S. Sukhbaatar, "Multi-Token Attention", 2025, arXiv
2504.00927. Upstream: facebookresearch/RAM @ e6f051fbcfaef4cab69bf2ea1b25f500f94c0c64
``projects/mta/mta_transformer.py`` (``Attention.forward``, ``_mta_convolution``,
``_head_convolution``, ``RMSNorm``), with facebookresearch/lingua ``lingua/transformer.py``
(``apply_rotary_emb``, ``precompute_freqs_cis``, ``repeat_kv``) @ 437d680e521873bb5971067148a69587790da853.

Agreement with upstream: ``Attention`` (``use_mta``) from ``mta_transformer.py`` with the lingua
RoPE/``repeat_kv`` functions run in float64 on CPU, with these edits to run it there: CUDA-only
tensors (``RMSNorm.layer_id``, the ``rsqrt`` scale) on the CPU, the float32 casts (softmax,
``RMSNorm``, RoPE tables: bf16-training choices) raised to float64, and a ``clone`` of the softmax
output, which the post-softmax convolution zeroes in place (upstream's cast makes that copy when
the model is not float32). With every MTA stage on (pre-softmax kernel, ``wpsm``, post-softmax
kernel, ``head_kernel`` or ``wposm``, group norm with and without ``layer_norm_rescale``, 1-D
and full gates), ``pad_key`` both/left/right, GQA ($H = 4$, $H_{kv} = 2$) and MHA: output and the
gradients of ``x`` and every parameter agree within $7.6\times10^{-15}$ relative.

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_param_keys,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.activations import sigmoid, sigmoid_grad
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import rms_norm_backward, rms_norm_forward
from ...nn.softmax import apply_mask, softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax import KV_GROUP_MAPS, expand_kv, reduce_kv
from ._samples import explicit_softmax
from .core import additive_mask, diff_attention_core, matrix_param, resolve_scale, validate_qkv, vector_param
from .layer import rope_apply, rope_tables

__all__ = [
    "multi_token_attention_forward",
    "multi_token_attention_backward",
    "multi_token_attention",
    "multi_token_attention_layer_forward",
    "multi_token_attention_layer_backward",
    "multi_token_attention_layer",
]


_PAPER_MTA = "O. Golovneva, T. Wang, J. Weston, S. Sukhbaatar, 'Multi-Token Attention', 2025, arXiv 2504.00927"


_MTA_KEYS = ("mta_kernel", "wpsm", "mta_kernel_after_sm", "head_kernel", "wposm", "subln.weight", "gate.weight",
             "gate.bias")


def _pad_widths(pad_key, ck, name):
    if pad_key == "both":
        if (ck - 1) % 2:
            raise ValueError(f"{name}: pad_key='both' needs an odd key kernel size; got {ck}")
        return (ck - 1) // 2, (ck - 1) // 2
    return (ck - 1, 0) if pad_key == "left" else (0, ck - 1)


def _kq_conv(x, kern, pad_key):
    r"""Per-head 2-D cross-correlation of score maps ``x (..., H, N, M)`` with ``kern (H, cq, ck)``:
    $y_{h,i,j} = \sum_{a,b}\theta_{h,a,b}\,\tilde x_{h,\,i+a-(c_q-1),\,j+b-p_l}$, zero outside
    (left-only padding of the query axis: causal along queries)."""
    cq, ck = kern.shape[-2:]
    pl, pr = _pad_widths(pad_key, ck, "kernel")
    n, m = x.shape[-2:]
    widths = [(0, 0)] * (x.ndim - 2) + [(cq - 1, 0), (pl, pr)]
    xp = np.pad(x, widths)
    y = np.zeros_like(x)
    for a in range(cq):
        for b in range(ck):
            y += kern[:, a, b][:, None, None] * xp[..., a:a + n, b:b + m]
    return y, xp


def _kq_conv_bwd(dy, xp, kern, pad_key):
    """Adjoint of :func:`_kq_conv`: the input gradient (a transposed convolution) and the kernel gradient."""
    cq, ck = kern.shape[-2:]
    pl, _ = _pad_widths(pad_key, ck, "kernel")
    n, m = dy.shape[-2:]
    dxp = np.zeros_like(xp)
    dk = np.zeros_like(kern)
    red = tuple(range(dy.ndim - 3)) + (dy.ndim - 2, dy.ndim - 1)
    for a in range(cq):
        for b in range(ck):
            dxp[..., a:a + n, b:b + m] += kern[:, a, b][:, None, None] * dy
            dk[:, a, b] = np.sum(dy * xp[..., a:a + n, b:b + m], axis=red)
    return dxp[..., cq - 1:, pl:pl + m], dk


def _head_mix(x, w):
    """$y_{h'} = \\sum_h W_{h,h'} x_h$ over the head axis -3 (``W`` is ``(in, out)``)."""
    return np.einsum("...hij,hg->...gij", x, w)


def _head_mix_bwd(dy, x, w):
    red = np.einsum("bhij,bgij->hg", x.reshape((-1,) + x.shape[-3:]), dy.reshape((-1,) + dy.shape[-3:]))
    return np.einsum("...gij,hg->...hij", dy, w), red


def _head_conv(x, kern):
    """Grouped head convolution: heads split into ``G`` groups of ``c``; $y_{g,h'} = \\sum_h x_{g,h}K_{g,h,h'}$."""
    g, c, _ = kern.shape
    xs = x.reshape(x.shape[:-3] + (g, c) + x.shape[-2:])
    return np.einsum("...ghij,ghk->...gkij", xs, kern).reshape(x.shape)


def _head_conv_bwd(dy, x, kern):
    g, c, _ = kern.shape
    xs = x.reshape((-1, g, c) + x.shape[-2:])
    dys = dy.reshape((-1, g, c) + dy.shape[-2:])
    dk = np.einsum("bghij,bgkij->ghk", xs, dys)
    dx = np.einsum("...gkij,ghk->...ghij", dy.reshape(dy.shape[:-3] + (g, c) + dy.shape[-2:]), kern)
    return dx.reshape(dy.shape), dk


def multi_token_attention_forward(q, k, v, params=None, *, attn_mask=None, is_causal=True, scale=None,
                                  pad_key="both", layer_norm_rescale=False, layer_id=0, subln_eps=1e-5,
                                  kv_group_map="contiguous"):
    r"""Multi-Token Attention core (Golovneva, Wang, Weston, Sukhbaatar 2025), per layer.

    $S_h = s\,Q_hK_h^\top$; every stage below is switched on by the presence of its parameter:

    1. ``mta_kernel`` ``(H, 1, c_q, c_k)``: pre-softmax key–query convolution. Masked entries of
       $S$ are set to 0, the query axis is zero-padded by $(c_q-1, 0)$ (causal), the key axis by
       ``pad_key``: ``"both"`` $((c_k-1)/2, (c_k-1)/2)$ (upstream default; needs odd $c_k$),
       ``"left"`` $(c_k-1, 0)$ or ``"right"`` $(0, c_k-1)$, then per head
       $\hat S_{h,i,j} = \sum_{a,b}\theta_{h,a,b}\,\tilde S_{h,i+a-(c_q-1),j+b-p_l}$.
    2. ``wpsm`` ``(H, H)``: pre-softmax head mixing $\hat S_{h'} = \sum_h W_{h,h'}\hat S_h$.
    3. $A = \mathrm{softmax}(\hat S + M)$ (masked entries removed again).
    4. ``mta_kernel_after_sm``: the same convolution on $A$, then masked entries re-zeroed.
    5. ``head_kernel`` ``(H/c_h, c_h, c_h)``: grouped head convolution
       $A'_{g,h'} = \sum_{h\in g}A_{g,h}K_{g,h,h'}$; or ``wposm`` ``(H, H)``: a full head mix.
    6. $O_h = A'_hV_h$.
    7. ``subln.weight`` ``(d_v,)``: the "group norm", RMSNorm over the head width (eps
       ``subln_eps=1e-5``, affine), times $(1-\lambda_{init})$,
       $\lambda_{init} = 0.8 - 0.6e^{-0.3\,\ell}$ with $\ell$ = ``layer_id``, if ``layer_norm_rescale``.
    8. ``gate.weight`` ``(d_v, 1)`` or ``(d_v, d_v)`` and ``gate.bias``: $O \leftarrow O\odot\sigma(OW_g + b_g)$.

    The output ``(..., H, N, d_v)`` is what upstream feeds to ``wo`` (after merging heads).

    DIFF attention is a special case: $c_h = 2$ with $K = \begin{pmatrix}1 & \cdot\\ -\lambda & \cdot\end{pmatrix}$
    gives $A'_1 = A_1 - \lambda A_2$.

    ``k``, ``v`` may have $H_{kv}$ heads ($H_{kv}$ divides $H$): they are repeated to the $H$
    query heads (``kv_group_map="contiguous"``: head $h$ reads kv head $\lfloor h/r\rfloor$,
    lingua ``repeat_kv``; ``"strided"``: $h \bmod H_{kv}$) and their gradients come back on the
    $H_{kv}$ heads, summed over the query heads that read them.

    Upstream: facebookresearch/RAM ``projects/mta/mta_transformer.py`` (``Attention.forward``,
    ``_mta_convolution``, ``_head_convolution``, ``RMSNorm``). Conventions there: causal LM mask
    (top-left, ``triu(-inf, 1)``; ``is_causal=True``), ``pad_key="both"``, softmax in float32,
    ``scale`` $=d^{-1/2}$, K/V repeated for GQA by ``repeat_kv`` (contiguous), parameter
    layouts as upstream (``mta_kernel`` is the ``Conv2d`` weight ``(H, 1, c_q, c_k)``,
    ``head_kernel`` ``(H/c_h, c_h, c_h)`` used as ``A^T @ K``); the ``nn.Linear`` weights are
    ``(in, out)``: ``wpsm = wpsm.weight.T``, ``wposm = wposm.weight.T``, ``gate.weight =
    gate.weight.T``. Upstream's identity init is $\theta_{h,-1,c_k//2} = 1$ (requires ``"both"``),
    identity head mixes. refattn defines fully masked rows as 0 (upstream gives NaN there).

    Backward
    --------
    Reverse order. Gate: $u = OW_g + b_g$, $dO = G\odot\sigma(u) + du\,W_g^\top$ with
    $du = \sum_{\text{gate width}} G\odot O\,\sigma'(u)$, $dW_g = O^\top du$, $db_g = \sum du$.
    RMSNorm VJP (``refattn.nn.norms``). $dA' = dO\,V^\top$, $dV = A'^\top dO$. Head mix:
    $dA_h = \sum_{h'}W_{h,h'}dA'_{h'}$, $dW_{h,h'} = \langle A_h, dA'_{h'}\rangle$ (per group for
    the head convolution). Re-zeroing and the input zeroing pass the gradient only at unmasked
    entries. Convolution: $dx_{i',j'} = \sum_{a,b}\theta_{a,b}\,dy_{i'-a+(c_q-1),\,j'-b+p_l}$ (a
    transposed convolution, computed as the adjoint of the padded correlation),
    $d\theta_{a,b} = \sum_{i,j}dy_{i,j}\tilde x_{i+a-(c_q-1),j+b-p_l}$. Softmax VJP, then
    $dQ = s\,dS K$, $dK = s\,dS^\top Q$.
    """
    q, k, v, dt = validate_qkv(q, k, v, same_heads=False)
    h, m, d = q.shape[-3], k.shape[-2], q.shape[-1]
    hkv = k.shape[-3]
    if v.shape[-3] != hkv or h % hkv:
        raise ValueError(f"k and v must have the same number of kv heads (axis -3) dividing q's H={h}; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    group = h // hkv
    k_in_shape, v_in_shape = k.shape, v.shape
    k, v = expand_kv(k, group, kv_group_map), expand_kv(v, group, kv_group_map)
    dv_ = v.shape[-1]
    params = {} if params is None else params
    check_param_keys(params, (), _MTA_KEYS)
    check_choice(pad_key, "pad_key", ("both", "left", "right"))
    if "head_kernel" in params and "wposm" in params:
        raise ValueError("params may hold 'head_kernel' or 'wposm' (post-softmax head mixing), not both "
                         "(upstream: 'linear head can not be combined with head conv')")
    P = {}
    for name in ("mta_kernel", "mta_kernel_after_sm"):
        if name in params:
            kern = as_float(params[name], name, ndim=4)
            if kern.shape[0] != h or kern.shape[1] != 1:
                raise ValueError(f"{name} must have the Conv2d shape (H, 1, c_q, c_k) with H={h}; got {kern.shape}")
            _pad_widths(pad_key, kern.shape[-1], name)
            P[name] = kern[:, 0].astype(dt, copy=False)
    for name in ("wpsm", "wposm"):
        if name in params:
            P[name] = matrix_param(params, name, h, dt, n_out=h)
    if "head_kernel" in params:
        hk = as_float(params["head_kernel"], "head_kernel", ndim=3)
        if hk.shape[1] != hk.shape[2] or hk.shape[0] * hk.shape[1] != h:
            raise ValueError(f"head_kernel must have shape (H/c_h, c_h, c_h) with H={h}; got {hk.shape}")
        P["head_kernel"] = hk.astype(dt, copy=False)
    if "subln.weight" in params:
        P["subln.weight"] = vector_param(params, "subln.weight", dv_, dt)
    if ("gate.weight" in params) != ("gate.bias" in params):
        raise ValueError("params must hold both 'gate.weight' and 'gate.bias' (nn.Linear(head_dim, 1 or head_dim)) "
                         "or neither")
    if "gate.weight" in params:
        gw = as_float(params["gate.weight"], "gate.weight", ndim=2)
        if gw.shape not in ((dv_, 1), (dv_, dv_)):
            raise ValueError(f"gate.weight must have shape (d_v, 1) or (d_v, d_v) = ({dv_}, 1) or ({dv_}, {dv_}); "
                             f"got {gw.shape}" + (" (PyTorch's nn.Linear.weight is (out, in): pass its transpose, "
                                                  f"of shape {gw.shape[::-1]})" if gw.shape[1] == dv_ else ""))
        P["gate.weight"] = gw.astype(dt, copy=False)
        P["gate.bias"] = vector_param(params, "gate.bias", gw.shape[1], dt)
    if not isinstance(layer_norm_rescale, (bool, np.bool_)):
        raise TypeError(f"layer_norm_rescale must be a bool; got {type(layer_norm_rescale).__name__}")
    layer_id = check_int(layer_id, "layer_id", minimum=0)
    subln_eps = check_positive(subln_eps, "subln_eps")
    sc = resolve_scale(scale, d)
    mask = additive_mask(attn_mask, is_causal, q.shape[:-1] + (m,))
    removed = None if mask is None else np.broadcast_to(np.isneginf(mask), q.shape[:-1] + (m,))

    c = {"q": q, "k": k, "v": v, "P": P, "scale": sc, "pad_key": pad_key, "removed": removed,
         "gqa": (group, kv_group_map, k_in_shape, v_in_shape)}
    s = sc * (q @ np.swapaxes(k, -1, -2))
    if "mta_kernel" in P:
        s0 = s if removed is None else np.where(removed, 0.0, s)
        s, c["xp_pre"] = _kq_conv(s0, P["mta_kernel"], pad_key)
    if "wpsm" in P:
        c["s_premix"] = s
        s = _head_mix(s, P["wpsm"])
    a, _ = softmax_lse(apply_mask(s, mask), -1)
    c["a_sm"] = a
    if "mta_kernel_after_sm" in P:
        a, c["xp_post"] = _kq_conv(a, P["mta_kernel_after_sm"], pad_key)
        if removed is not None:
            a = np.where(removed, 0.0, a)
    if "head_kernel" in P or "wposm" in P:
        c["a_premix"] = a
        a = _head_conv(a, P["head_kernel"]) if "head_kernel" in P else _head_mix(a, P["wposm"])
    c["a"] = a
    o = a @ v
    if "subln.weight" in P:
        o, c["rms"] = rms_norm_forward(o, {"weight": P["subln.weight"]}, eps=subln_eps)
        c["rescale"] = 1.0 - (0.8 - 0.6 * math.exp(-0.3 * layer_id)) if layer_norm_rescale else 1.0
        o = o * c["rescale"]
    if "gate.weight" in P:
        c["o_pregate"] = o
        u = o @ P["gate.weight"] + P["gate.bias"]
        c["u"] = u
        o = o * sigmoid(u)
    return o, c


def multi_token_attention_backward(dout, cache):
    """Gradients of :func:`multi_token_attention_forward` (derivation in its docstring)."""
    q, k, v, P, rem = cache["q"], cache["k"], cache["v"], cache["P"], cache["removed"]
    g = as_dout(dout, q.shape[:-1] + (v.shape[-1],), q.dtype)
    grads = {}
    if "gate.weight" in P:
        o, u = cache["o_pregate"], cache["u"]
        gate = sigmoid(u)
        du = g * o * sigmoid_grad(u) if u.shape[-1] > 1 else np.sum(g * o, -1, keepdims=True) * sigmoid_grad(u)
        grads["gate.weight"] = o.reshape(-1, o.shape[-1]).T @ du.reshape(-1, du.shape[-1])
        grads["gate.bias"] = du.reshape(-1, du.shape[-1]).sum(0)
        g = g * gate + du @ P["gate.weight"].T
    if "subln.weight" in P:
        gr = rms_norm_backward(g * cache["rescale"], cache["rms"])
        grads["subln.weight"], g = gr["weight"], gr["x"]
    a = cache["a"]
    dv = np.swapaxes(a, -1, -2) @ g
    da = g @ np.swapaxes(v, -1, -2)
    if "head_kernel" in P:
        da, grads["head_kernel"] = _head_conv_bwd(da, cache["a_premix"], P["head_kernel"])
    elif "wposm" in P:
        da, grads["wposm"] = _head_mix_bwd(da, cache["a_premix"], P["wposm"])
    if "mta_kernel_after_sm" in P:
        if rem is not None:
            da = np.where(rem, 0.0, da)
        da, dker = _kq_conv_bwd(da, cache["xp_post"], P["mta_kernel_after_sm"], cache["pad_key"])
        grads["mta_kernel_after_sm"] = dker[:, None]
    ds = softmax_vjp(cache["a_sm"], da, -1)
    if "wpsm" in P:
        ds, grads["wpsm"] = _head_mix_bwd(ds, cache["s_premix"], P["wpsm"])
    if "mta_kernel" in P:
        ds, dker = _kq_conv_bwd(ds, cache["xp_pre"], P["mta_kernel"], cache["pad_key"])
        grads["mta_kernel"] = dker[:, None]
        if rem is not None:
            ds = np.where(rem, 0.0, ds)
    sc = cache["scale"]
    group, gmap = cache["gqa"][:2]
    grads["q"] = sc * (ds @ k)
    grads["k"] = reduce_kv(sc * (np.swapaxes(ds, -1, -2) @ q), group, gmap)
    grads["v"] = reduce_kv(dv, group, gmap)
    return grads


def multi_token_attention(q, k, v, params=None, **config):
    """Convenience wrapper: the output of :func:`multi_token_attention_forward`."""
    return multi_token_attention_forward(q, k, v, params, **config)[0]


# --------------------------------------------------------------------------------------------
# The full layer (upstream Attention with use_mta)


_MTA_LAYER_RENAME = {"wpsm.weight": "wpsm", "wposm.weight": "wposm"}


def multi_token_attention_layer_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                                        rope_theta: float | None = 10000.0, attn_mask=None, is_causal=True,
                                        scale=None, pad_key="both", layer_norm_rescale=False, layer_id=0,
                                        subln_eps=1e-5):
    r"""Multi-Token Attention layer: upstream ``Attention`` (``use_mta``) of facebookresearch/RAM
    ``projects/mta/mta_transformer.py``.

    $$Q = \mathrm{rope}(XW_q),\quad K = \mathrm{rope}(XW_k),\quad V = XW_v,\qquad
    Y = [\mathrm{MTA}(Q_h, K_{g(h)}, V_{g(h)})]_h\,W_o,$$

    MTA being :func:`multi_token_attention_forward` (every stage switched on by its parameter),
    $H_{kv}$ kv heads repeated contiguously (lingua ``repeat_kv``), RoPE interleaved on feature
    pairs $(2j, 2j+1)$ with $\theta_j = \text{rope\_theta}^{-2j/d}$ at positions $0..N-1$ (lingua
    ``precompute_freqs_cis`` / ``apply_rotary_emb``).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        Upstream ``state_dict`` names, ``nn.Linear`` weights ``(in, out)`` (PyTorch ``weight.T``):
        ``wq.weight (C, H*d)``, ``wk.weight (C, Hkv*d)``, ``wv.weight (C, Hkv*d)``,
        ``wo.weight (H*d, C_out)`` (bias-free upstream; optional ``.bias`` accepted), and the MTA
        stages under their upstream names: ``mta_kernel (H, 1, c_q, c_k)``, ``wpsm.weight (H, H)``,
        ``mta_kernel_after_sm``, ``head_kernel (H/c_h, c_h, c_h)`` or ``wposm.weight (H, H)``,
        ``subln.weight (d,)``, ``gate.weight (d, 1 or d)`` and ``gate.bias``.
    num_heads, num_kv_heads : int
        $H$ and $H_{kv}$ (default $H$); $d$ is inferred from ``wq.weight``.
    rope_theta : float or None
        RoPE base (lingua default 10000; the MTA configs use 100000); ``None``: no RoPE.
    attn_mask, is_causal, scale, pad_key, layer_norm_rescale, layer_id, subln_eps
        As :func:`multi_token_attention_forward` (upstream: causal, ``pad_key="both"``).

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``; :func:`multi_token_attention_layer_backward` returns ``"x"`` and
        every params key.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    hkv = h if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if h % hkv:
        raise ValueError(f"num_heads ({h}) must be a multiple of num_kv_heads ({hkv})")
    if not isinstance(params, dict) or "wq.weight" not in params:
        raise ValueError("params must be a dict containing 'wq.weight' of shape (C, num_heads * head_dim)")
    c = x.shape[-1]
    check_weight_in(params, "wq.weight", c, input_name="x")
    qw = np.shape(params["wq.weight"])
    if len(qw) != 2 or qw[0] != c or qw[1] % h:
        raise ValueError(f"wq.weight must have shape (C={c}, num_heads * head_dim) with num_heads={h}; got {qw}")
    d = qw[1] // h
    ow = np.shape(params.get("wo.weight", ()))
    c_out = ow[1] if len(ow) == 2 else c
    spec = {**linear_prefixed_spec("wq", c, h * d), **linear_prefixed_spec("wk", c, hkv * d),
            **linear_prefixed_spec("wv", c, hkv * d), **linear_prefixed_spec("wo", h * d, c_out)}
    core_keys = [key for key in params if key not in spec]
    p = check_params({key: params[key] for key in spec if key in params}, spec,
                     optional=("wq.bias", "wk.bias", "wv.bias", "wo.bias"), where="multi_token_attention_layer")
    core_params = {_MTA_LAYER_RENAME.get(key, key): params[key] for key in core_keys}
    for key in ("wpsm", "wposm"):
        if key in params:
            raise ValueError(f"params of the layer name the head mix '{key}.weight' (upstream state_dict); got '{key}'")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n = x.shape[-2]
    cos = sin = None
    if rope_theta is not None:
        theta = check_positive(rope_theta, "rope_theta")
        if d % 2:
            raise ValueError(f"RoPE rotates feature pairs: the head width d must be even; got d={d}")
        cos, sin = (t.astype(dt) for t in rope_tables(n, d, base=theta))
    q = rope_apply(split_heads(linear_prefixed(p, "wq", x), h, d), cos, sin, True)
    k = rope_apply(split_heads(linear_prefixed(p, "wk", x), hkv, d), cos, sin, True)
    v = split_heads(linear_prefixed(p, "wv", x), hkv, d)
    o, core = multi_token_attention_forward(q, k, v, core_params, attn_mask=attn_mask, is_causal=is_causal,
                                            scale=scale, pad_key=pad_key, layer_norm_rescale=layer_norm_rescale,
                                            layer_id=layer_id, subln_eps=subln_eps)
    merged = merge_heads(o)
    y = linear_prefixed(p, "wo", merged)
    return y, {"x": x, "p": p, "core": core, "merged": merged, "rope": (cos, sin), "heads": (h, hkv, d),
               "shape": y.shape}


def multi_token_attention_layer_backward(dout, cache):
    r"""Gradients of :func:`multi_token_attention_layer_forward` for ``x`` and every params key:
    $dW_o = Z^\top G$, the core's backward (kv gradients already summed over the repeated heads),
    the RoPE VJP (rotation by $-\theta$) on $dQ$, $dK$, then $dX = \sum_p dP\,W_p^\top$."""
    x, p = cache["x"], cache["p"]
    g = as_dout(dout, cache["shape"], x.dtype)
    h, hkv, d = cache["heads"]
    cos, sin = cache["rope"]
    grads: dict = {}
    dm = linear_prefixed_vjp(grads, p, "wo", g, cache["merged"])
    gc = multi_token_attention_backward(split_heads(dm, h, d), cache["core"])
    dq = rope_apply(gc.pop("q"), cos, sin, True, conjugate=True)
    dk = rope_apply(gc.pop("k"), cos, sin, True, conjugate=True)
    dx = linear_prefixed_vjp(grads, p, "wq", merge_heads(dq), x)
    dx = dx + linear_prefixed_vjp(grads, p, "wk", merge_heads(dk), x)
    dx = dx + linear_prefixed_vjp(grads, p, "wv", merge_heads(gc.pop("v")), x)
    inverse = {v_: k_ for k_, v_ in _MTA_LAYER_RENAME.items()}
    grads.update({inverse.get(key, key): val for key, val in gc.items()})
    grads["x"] = dx
    return grads


def multi_token_attention_layer(x, params, **config):
    """Convenience wrapper: the output of :func:`multi_token_attention_layer_forward`."""
    return multi_token_attention_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_mta(rng, size):
    if size == "tiny":
        b, h, n, d = 2, 2, int(rng.integers(3, 5)), 2
        ker = (2, 3)
    else:
        b, h, n, d = 2, 4, int(rng.integers(6, 9)), 3
        ker = (3, 3)
    pad = "both" if size == "tiny" else "left"
    hkv = int(rng.choice([h // 2, h]))  # GQA: unrepeated keys and values
    q, k = rng.standard_normal((b, h, n, d)), rng.standard_normal((b, hkv, n, d))
    # larger values keep A'V away from 0, where the RMS "group norm" is sharply curved and
    # central differences lose digits (curvature, not a kink)
    v = 3.0 * rng.standard_normal((b, hkv, n, d))
    params = {"mta_kernel": 0.5 * rng.standard_normal((h, 1) + ker),
              "wpsm": np.eye(h) + 0.3 * rng.standard_normal((h, h)),
              "mta_kernel_after_sm": _identity_mta_params(h, *ker, pad_key=pad)["mta_kernel"]
              + 0.2 * rng.standard_normal((h, 1) + ker),
              "subln.weight": 1.0 + 0.2 * rng.standard_normal(d)}
    if size == "tiny":
        params["head_kernel"] = np.eye(2)[None] + 0.3 * rng.standard_normal((1, 2, 2))
        params["gate.weight"], params["gate.bias"] = rng.standard_normal((d, 1)), 0.1 * rng.standard_normal(1)
        cfg = {"is_causal": True, "pad_key": "both"}
    else:
        params["wposm"] = np.eye(h) + 0.2 * rng.standard_normal((h, h))
        params["gate.weight"], params["gate.bias"] = rng.standard_normal((d, d)), 0.1 * rng.standard_normal(d)
        cfg = {"is_causal": True, "pad_key": pad, "layer_norm_rescale": True, "layer_id": 3}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config=cfg)


def _reference_mta(q, k, v, params=None, *, attn_mask=None, is_causal=True, scale=None, pad_key="both",
                   layer_norm_rescale=False, layer_id=0, subln_eps=1e-5, kv_group_map="contiguous"):
    # Element-wise index arithmetic for the convolutions (independent of the padded-slice path).
    assert attn_mask is None and is_causal
    params = params or {}
    rep = q.shape[1] // k.shape[1]
    idx = [hh // rep if kv_group_map == "contiguous" else hh % k.shape[1] for hh in range(q.shape[1])]
    k, v = k[:, idx], v[:, idx]
    b_, h, n, d = q.shape
    m = k.shape[-2]
    sc = d**-0.5 if scale is None else scale
    keep = np.arange(m)[None, :] <= np.arange(n)[:, None]

    def conv(x, kern):
        cq, ck = kern.shape[-2:]
        pl = {"both": (ck - 1) // 2, "left": ck - 1, "right": 0}[pad_key]
        y = np.zeros_like(x)
        for bb, hh, i, j in np.ndindex(x.shape):
            acc = 0.0
            for a in range(cq):
                for c_ in range(ck):
                    ii, jj = i + a - (cq - 1), j + c_ - pl
                    if 0 <= ii < n and 0 <= jj < m:
                        acc += kern[hh, 0, a, c_] * x[bb, hh, ii, jj]
            y[bb, hh, i, j] = acc
        return y

    s = sc * np.einsum("bhnd,bhmd->bhnm", q, k)
    if "mta_kernel" in params:
        s = conv(np.where(keep, s, 0.0), params["mta_kernel"])
    if "wpsm" in params:
        s = np.einsum("bhnm,hg->bgnm", s, params["wpsm"])
    a = explicit_softmax(np.where(keep, s, -np.inf))
    if "mta_kernel_after_sm" in params:
        a = np.where(keep, conv(a, params["mta_kernel_after_sm"]), 0.0)
    if "head_kernel" in params:
        hk = params["head_kernel"]
        c_h = hk.shape[1]
        a2 = np.zeros_like(a)
        for hp in range(h):
            grp, j = divmod(hp, c_h)
            for i in range(c_h):
                a2[:, hp] += a[:, grp * c_h + i] * hk[grp, i, j]
        a = a2
    elif "wposm" in params:
        a = np.einsum("bhnm,hg->bgnm", a, params["wposm"])
    o = a @ v
    if "subln.weight" in params:
        o = o / np.sqrt(np.mean(o**2, -1, keepdims=True) + subln_eps) * params["subln.weight"]
        if layer_norm_rescale:
            o = o * (1 - (0.8 - 0.6 * np.exp(-0.3 * layer_id)))
    if "gate.weight" in params:
        o = o / (1 + np.exp(-(o @ params["gate.weight"] + params["gate.bias"])))
    return o


def _identity_mta_params(h, cq, ck, c_h=None, pad_key="both"):
    # The tap that reads entry (i, j) itself: upstream's identity init for "both" is [-1, ck // 2].
    kern = np.zeros((h, 1, cq, ck))
    kern[:, 0, -1, {"both": ck // 2, "left": ck - 1, "right": 0}[pad_key]] = 1.0
    p = {"mta_kernel": kern, "wpsm": np.eye(h), "mta_kernel_after_sm": kern.copy()}
    if c_h is not None:
        p["head_kernel"] = np.repeat(np.eye(c_h)[None], h // c_h, axis=0)
    return p


def _check_mta_identity_is_sdpa(rng):
    q, k, v = (rng.standard_normal((2, 4, 7, 3)) for _ in range(3))
    out = multi_token_attention(q, k, v, _identity_mta_params(4, 3, 5, c_h=2))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(3)
    s = np.where(np.tril(np.ones((7, 7), bool)), s, -np.inf)
    err = float(np.abs(out - explicit_softmax(s) @ v).max())
    assert err < 1e-12, f"identity kernels do not reproduce causal SDPA: {err}"
    return err


def _check_mta_diff_special_case(rng):
    # c_h = 2 post-softmax head convolution with K = [[1, 0], [-lambda, 1]]: head 0 is DIFF attention.
    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    lam = 0.63
    out = multi_token_attention(q, k, v, {"head_kernel": np.array([[[1.0, 0.0], [-lam, 1.0]]])})
    ref = diff_attention_core(q[:, :1], k[:, :1], q[:, 1:], k[:, 1:], v[:, :1], np.array([lam]), is_causal=True)
    err = float(np.abs(out[:, :1] - ref).max())
    assert err < 1e-12, f"MTA head mixing does not reproduce diff_attention_core: {err}"
    return err


def _check_mta_causal(rng):
    s = _sample_mta(rng, "small")
    q, k, v = (s.inputs[x] for x in "qkv")
    for pad in ("both", "left", "right"):
        cfg = dict(s.config, pad_key=pad)
        out = multi_token_attention(q, k, v, s.params, **cfg)
        t = q.shape[-2] // 2
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        for a in (q2, k2, v2):
            a[..., t + 1:, :] += rng.standard_normal(a[..., t + 1:, :].shape)
        out2 = multi_token_attention(q2, k2, v2, s.params, **cfg)
        err = float(np.abs(out[..., : t + 1, :] - out2[..., : t + 1, :]).max())
        assert err < 1e-14, f"pad_key={pad}: future tokens leak into the past: {err}"
    return 0.0


def _check_mta_conv_adjoint(rng):
    x = rng.standard_normal((2, 3, 5, 6))
    kern = rng.standard_normal((3, 3, 5))
    y, xp = _kq_conv(x, kern, "both")
    g = rng.standard_normal(y.shape)
    dx, dk = _kq_conv_bwd(g, xp, kern, "both")
    err = abs(float(np.sum(y * g)) - float(np.sum(x * dx))) / abs(float(np.sum(y * g)))
    err_k = abs(float(np.sum(y * g)) - float(np.sum(kern * dk))) / abs(float(np.sum(y * g)))
    assert max(err, err_k) < 1e-12, f"<conv x, g> != <x, conv^T g>: {err}, {err_k}"
    return max(err, err_k)


def _check_mta_gqa_reduces_gradients(rng):
    # unrepeated K/V (H_kv = 2 of H = 4) equal the explicitly repeated call; their gradients are
    # the sums of the repeated heads' gradients (both head maps)
    s = _sample_mta(rng, "small")
    q = s.inputs["q"]
    k, v = (rng.standard_normal(q.shape[:1] + (2,) + q.shape[2:]) for _ in range(2))
    err = 0.0
    for gmap in ("contiguous", "strided"):
        idx = np.arange(4) // 2 if gmap == "contiguous" else np.arange(4) % 2
        out, c = multi_token_attention_forward(q, k, v, s.params, kv_group_map=gmap, **s.config)
        out2, c2 = multi_token_attention_forward(q, k[:, idx], v[:, idx], s.params, **s.config)
        g = rng.standard_normal(out.shape)
        g1, g2 = multi_token_attention_backward(g, c), multi_token_attention_backward(g, c2)
        for name, src in (("k", k), ("v", v)):
            red = np.zeros_like(src)
            np.add.at(red, (slice(None), idx), g2[name])
            assert g1[name].shape == src.shape, f"{name} gradient shape {g1[name].shape} != {src.shape}"
            err = max(err, float(np.abs(g1[name] - red).max()))
        err = max(err, float(np.abs(out - out2).max()), float(np.abs(g1["q"] - g2["q"]).max()))
    assert err < 1e-12, f"GQA call differs from the repeated call: {err}"
    return err


def _layer_params(rng, c, h, hkv, d, *, gate_1d=True, head_kernel=True):
    p = {"wq.weight": rng.standard_normal((c, h * d)) / np.sqrt(c),
         "wk.weight": rng.standard_normal((c, hkv * d)) / np.sqrt(c),
         "wv.weight": 2.0 * rng.standard_normal((c, hkv * d)) / np.sqrt(c),
         "wo.weight": rng.standard_normal((h * d, c)) / np.sqrt(h * d),
         "mta_kernel": 0.5 * rng.standard_normal((h, 1, 2, 3)),
         "wpsm.weight": np.eye(h) + 0.3 * rng.standard_normal((h, h)),
         "mta_kernel_after_sm": _identity_mta_params(h, 2, 3)["mta_kernel"] + 0.2 * rng.standard_normal((h, 1, 2, 3)),
         "subln.weight": 1.0 + 0.2 * rng.standard_normal(d),
         "gate.weight": rng.standard_normal((d, 1 if gate_1d else d)),
         "gate.bias": 0.1 * rng.standard_normal(1 if gate_1d else d)}
    if head_kernel:
        p["head_kernel"] = np.eye(2)[None].repeat(h // 2, 0) + 0.3 * rng.standard_normal((h // 2, 2, 2))
    else:
        p["wposm.weight"] = np.eye(h) + 0.2 * rng.standard_normal((h, h))
    return p


def _check_mta_layer_gradcheck(rng):
    """The full layer (wq/wk/wv/wo, RoPE, GQA, every MTA stage): FD gradcheck of x and every
    parameter."""
    from ...testing import gradcheck

    x = 2.0 * rng.standard_normal((2, 3, 4))
    p = _layer_params(rng, 4, 2, 1, 2)
    # the convolution stages have their own FD check (the record's sample); keep the layer's to its
    # own chain: projections, RoPE, the GQA reduction, the renamed head mix, norm and gate
    for key in ("mta_kernel", "mta_kernel_after_sm", "head_kernel"):
        p.pop(key)
    s = Sample(inputs={"x": x}, params=p, config={"num_heads": 2, "num_kv_heads": 1, "rope_theta": 10.0})
    return gradcheck(multi_token_attention_layer_forward, multi_token_attention_layer_backward, s).max_rel


register(
    Mechanism(
        slug="multi_token_attention", family="2-differential", tier="T1",
        title="Multi-Token Attention: key-query convolution, head mixing, RMS group norm, gating",
        paper=_PAPER_MTA, forward=multi_token_attention_forward, backward=multi_token_attention_backward,
        sample=_sample_mta, reference=_reference_mta, docs="differential-relatives.md#multi-token-attention",
        checks={"identity_kernels_are_sdpa": _check_mta_identity_is_sdpa,
                "diff_special_case": _check_mta_diff_special_case, "causal_leakage": _check_mta_causal,
                "conv_adjoint": _check_mta_conv_adjoint, "gqa_unrepeated_kv": _check_mta_gqa_reduces_gradients,
                "layer_gradcheck": _check_mta_layer_gradcheck},
    ),
)
