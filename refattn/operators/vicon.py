r"""VICON: the in-context masked patch transformer of Vision In-Context Operator Networks.

Paper: Cao, Liu, Yang, Yu, Schaeffer, Osher, "VICON: Vision In-Context Operator Networks for
Multi-Physics Fluid Dynamics Prediction", TMLR 2026, arXiv 2411.16063. Upstream: Eydcao/VICON
``src/models.py`` (``ICON_UNCROPPED``) and ``src/model_utils.py`` (``patchify``, ``depatchify``,
``build_alternating_block_lowtri_mask``) @ be2e2dc6b327259c55b110340c3b55e30a427317.

Which part of the model
-----------------------
The whole network ``ICON_UNCROPPED`` (it is one layer stack): a sequence of $P$ example pairs
(condition frame $u_i$, target frame $v_i$) is cut into patch tokens, the tokens attend to each
other under the **in-context mask**, and the tokens of every condition frame are read out as the
prediction of its target. Outside this module: the data pipeline (pairs of frames at varying
strides), the rollout strategies and the training loss.

Forward
-------
Frames $u_i, v_i\in\mathbb R^{C\times pH\times pW}$ ($p$ = ``patch_num`` patches per side, each
$H\times W$). ``patchify`` gives $p^2$ tokens of width $CHW$ per frame (patches row-major, each
flattened channel-major), then

$$t_{i,r,j} = \mathrm{patchify}(f_{i,r})_j\,W_{pre} + b_{pre} + E^{patch}_j + E^{func}_{2i+r},
\qquad f_{i,0} = u_i,\ f_{i,1} = v_i,$$

ordered $(i, r, j)$ into a sequence of $L = 2Pp^2$ tokens of width $D$. ``num_layers`` post-norm
encoder layers (``nn.TransformerEncoderLayer``, ``norm_first=False``, GELU, dropout 0):

$$h \leftarrow \mathrm{LN}_1\big(h + \mathrm{MHA}(h; M)\big),\qquad
h \leftarrow \mathrm{LN}_2\big(h + W_2\,\mathrm{GELU}(W_1h + b_1) + b_2\big).$$

The in-context mask $M$ (upstream ``1 - build_alternating_block_lowtri_mask(P, p^2, p^2)``, True =
masked there; here the keep mask) lets token $s$ (pair $i_s$, role $r_s$) attend to token $t$ iff

$$i_t < i_s\quad\text{or}\quad\big(i_t = i_s\ \text{and}\ (r_s = 1\ \text{or}\ r_t = 0)\big):$$

every earlier pair entirely, and within its own pair a condition token sees only the condition
frame while a target token sees both frames. No row is empty (a token always sees its own frame).
The output is read at the condition tokens, $\hat v_i = \mathrm{depatchify}(h_{i,0}W_{post} + b_{post})$,
so the prediction of pair $i$ depends on pairs $< i$ (condition and target) and on $u_i$, never on
$v_i$ or on later pairs (check ``prediction_is_in_context``): one forward pass gives the
$0, 1, \dots, P-1$-shot predictions at once.

Backward
--------
All reused VJPs, in reverse order. The read-out scatters $dh_{i,0} = d\hat y_i W_{post}^\top$
(zero at the target tokens; $dW_{post} = \sum h_{i,0}^\top d\hat y_i$). Per layer, with
$a = h + \mathrm{MHA}(h)$, $x_1 = \mathrm{LN}_1(a)$, $z = x_1 + \mathrm{FF}(x_1)$, $y = \mathrm{LN}_2(z)$:

$$dz = J_{\mathrm{LN}_2}^\top dy,\quad dx_1 = dz + J_{\mathrm{FF}}^\top dz,\quad
da = J_{\mathrm{LN}_1}^\top dx_1,\quad dh = da + J_{\mathrm{MHA}}^\top da$$

(LayerNorm: ``normalize_backward``; FF: ``mlp_backward``; MHA with the mask held fixed:
``mha_backward``, whose $q/k/v$ weight gradients are packed back into ``in_proj_weight``). Then
$dE^{patch}_j = \sum_{b,i,r} dt_{i,r,j}$, $dE^{func}_{2i+r} = \sum_{b,j} dt_{i,r,j}$ (rows beyond
$2P$ get zero), $dW_{pre}$, $db_{pre}$ from the linear VJP, and the frames' gradients are the
token gradients ``depatchify``-ed (patchify is a permutation, its adjoint its inverse).

Conventions
-----------
* Parameter names are upstream's ``state_dict`` keys; Linear weights ``(in, out)`` = torch
  ``weight.T``, ``in_proj_weight (D, 3D)`` = torch ``in_proj_weight.T`` (columns $[Q\,K\,V]$).
* ``func_pos_encoding`` has ``2 * demo_num`` rows; a call with $P \le$ ``demo_num`` pairs uses the
  first $2P$ (upstream slices the same way; the mask built for ``demo_num`` pairs and cut to the
  first $2Pp^2$ tokens equals the mask built for $P$ pairs).
* ``use_patch_pos_encoding`` / ``use_func_pos_encoding`` (upstream config flags, default True):
  when off the encoding is not added; a key that is still given gets a zero gradient.
* Heads split the width head-major as ``nn.MultiheadAttention``; scale $1/\sqrt{D/H}$; LayerNorm
  ``eps`` 1e-5 (``layer_norm_eps``); exact (erf) GELU. Upstream's ``norm_first`` config entry is not
  passed to the encoder layer: the model is post-norm, as here.
* The cropped/rollout variants of the repository wrap this model; nothing here is reconstruction.

Agreement with upstream
-----------------------
``ICON_UNCROPPED`` itself, imported from the snapshot in a scratch script (``/tmp/scratch-o5b``,
not committed; the OmegaConf config replaced by a dict with attribute access), float64 on CPU,
torch 2.13, weights copied over and perturbed by $0.3\,N(0,1)$; 3 pairs (``demo_num`` 4, so the
slicing path runs), $C = 2$, $p = 2$, $D = 8$, 2 heads, feed-forward 12, 2 layers, batch 2, three
seeds each. Square $2\times2$ patches: output max abs error 1.8e-15 (7.2e-16 relative to the
largest entry), worst gradient (frames, projections, both encodings, every layer parameter)
2.2e-14 abs, 3.6e-15 relative to its array's largest entry. Rectangular $3\times2$ patches
(``pre_proj``/``post_proj`` rebuilt for the width $C\cdot3\cdot2$; upstream's config is square):
output 3.6e-15 abs (1.0e-15 relative), gradients 9.9e-14 abs, 5.1e-15 relative.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_weight_in, compute_dtype
from ..attention.softmax.mha import mha_backward, mha_forward
from ..blocks.core import mlp_backward, mlp_forward, norm_backward, norm_forward
from ..blocks.patch_embed import patchify, unpatchify
from ..nn.linear import init_torch_default, linear_apply, linear_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["in_context_mask", "vicon_param_shapes", "vicon_forward", "vicon_backward", "vicon",
           "init_vicon_params"]

_LAYER = "transformer.layers.{}"


def in_context_mask(num_pairs: int, cond_tokens: int, target_tokens: int) -> np.ndarray:
    r"""The in-context keep mask (True = attend) over ``num_pairs`` blocks of ``cond_tokens``
    condition then ``target_tokens`` target tokens: block lower-triangular over pairs, and inside a
    pair the condition rows do not see the target columns (module docstring). Upstream's
    ``build_alternating_block_lowtri_mask`` is this mask as 0/1; its model masks ``1 - mask``."""
    n = check_int(num_pairs, "num_pairs", minimum=1)
    s1 = check_int(cond_tokens, "cond_tokens", minimum=1)
    s2 = check_int(target_tokens, "target_tokens", minimum=1)
    pair = np.repeat(np.arange(n), s1 + s2)
    target = np.tile(np.r_[np.zeros(s1, bool), np.ones(s2, bool)], n)
    same = pair[:, None] == pair[None, :]
    return (pair[None, :] < pair[:, None]) | (same & (target[:, None] | ~target[None, :]))


def vicon_param_shapes(channels: int, patch_size, patch_num: int, dim_token: int, num_layers: int, *,
                       dim_feedforward: int, demo_num: int) -> dict:
    """``{key: shape}`` of ``ICON_UNCROPPED``'s parameters (Linear weights ``(in, out)``)."""
    ph, pw = patch_size
    cp, d = channels * ph * pw, dim_token
    s = {"pre_proj.weight": (cp, d), "pre_proj.bias": (d,), "post_proj.weight": (d, cp), "post_proj.bias": (cp,),
         "patch_pos_encoding": (patch_num * patch_num, d), "func_pos_encoding": (2 * demo_num, d)}
    for i in range(num_layers):
        pre = _LAYER.format(i)
        s.update({f"{pre}.self_attn.in_proj_weight": (d, 3 * d), f"{pre}.self_attn.in_proj_bias": (3 * d,),
                  f"{pre}.self_attn.out_proj.weight": (d, d), f"{pre}.self_attn.out_proj.bias": (d,),
                  f"{pre}.linear1.weight": (d, dim_feedforward), f"{pre}.linear1.bias": (dim_feedforward,),
                  f"{pre}.linear2.weight": (dim_feedforward, d), f"{pre}.linear2.bias": (d,),
                  f"{pre}.norm1.weight": (d,), f"{pre}.norm1.bias": (d,),
                  f"{pre}.norm2.weight": (d,), f"{pre}.norm2.bias": (d,)})
    return s


def _validate(init, end, params, num_heads, patch_num, use_patch, use_func):
    init = as_float(init, "init", ndim=5)
    end = as_float(end, "end", ndim=5)
    if init.shape != end.shape:
        raise ValueError(f"init and end must have the same shape (B, pairs, C, H, W); got init {init.shape}, "
                         f"end {end.shape}")
    p = check_int(patch_num, "patch_num", minimum=1)
    heads = check_int(num_heads, "num_heads", minimum=1)
    for flag, name in ((use_patch, "use_patch_pos_encoding"), (use_func, "use_func_pos_encoding")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    b, pairs, c, hh, ww = init.shape
    if hh % p or ww % p:
        raise ValueError(f"the frame size ({hh}, {ww}) of init/end must be a multiple of patch_num={p}")
    if not isinstance(params, dict) or params.get("pre_proj.weight") is None:
        raise ValueError("params must be a dict with ICON_UNCROPPED's weights (pre_proj.weight (C*h*w, D), ...)")
    if np.ndim(params["pre_proj.weight"]) == 2:  # dim_token is read off its output axis
        cp = c * (hh // p) * (ww // p)
        check_weight_in(params, "pre_proj.weight", cp, input_name=f"a patch (C*h*w = {c}*{hh // p}*{ww // p})")
    d = as_float(params["pre_proj.weight"], "pre_proj.weight", ndim=2).shape[1]
    layers = 0
    while f"{_LAYER.format(layers)}.self_attn.in_proj_weight" in params:
        layers += 1
    if layers < 1:
        raise ValueError(f"params needs at least one encoder layer ('{_LAYER.format(0)}.self_attn.in_proj_weight')")
    if d % heads:
        raise ValueError(f"num_heads ({heads}) must divide dim_token ({d}, the width of pre_proj.weight)")
    key1 = f"{_LAYER.format(0)}.linear1.weight"
    ff = as_float(params.get(key1, np.zeros((d, 1))), key1, ndim=2).shape[1]
    fpe = params.get("func_pos_encoding")
    demo = as_float(fpe, "func_pos_encoding", ndim=2).shape[0] // 2 if fpe is not None else pairs
    if demo < pairs:
        raise ValueError(f"func_pos_encoding has {2 * demo} rows (2 * demo_num); {pairs} pairs need at least "
                         f"{2 * pairs}")
    spec = vicon_param_shapes(c, (hh // p, ww // p), p, d, layers, dim_feedforward=ff, demo_num=demo)
    optional = [k for k, on in (("patch_pos_encoding", use_patch), ("func_pos_encoding", use_func)) if not on]
    prm = check_params(params, spec, optional=optional, where="vicon")
    dt = compute_dtype(init, end, *prm.values())
    return init.astype(dt, copy=False), end.astype(dt, copy=False), cast_all(dt, prm), heads, layers, dt


def _mha_params(p, pre):
    w, b = p[f"{pre}.self_attn.in_proj_weight"], p[f"{pre}.self_attn.in_proj_bias"]
    d = w.shape[0]
    return {"q_proj": w[:, :d], "k_proj": w[:, d:2 * d], "v_proj": w[:, 2 * d:],
            "out_proj": p[f"{pre}.self_attn.out_proj.weight"], "q_proj_bias": b[:d], "k_proj_bias": b[d:2 * d],
            "v_proj_bias": b[2 * d:], "out_proj_bias": p[f"{pre}.self_attn.out_proj.bias"]}


def vicon_forward(init, end, params, *, num_heads: int, patch_num: int, use_patch_pos_encoding: bool = True,
                  use_func_pos_encoding: bool = True, layer_norm_eps: float = 1e-5):
    r"""``ICON_UNCROPPED.forward((init, end, _))`` (module docstring).

    Parameters
    ----------
    init, end : arrays (B, P, C, pH, pW)
        Condition and target frames of the $P$ example pairs.
    params : dict
        :func:`vicon_param_shapes` keys (upstream names; Linear weights ``(in, out)``).
    num_heads : int
        Attention heads (upstream ``transformer.nhead``).
    patch_num : int
        Patches per side $p$ (upstream ``patch_num_in``).
    use_patch_pos_encoding, use_func_pos_encoding : bool
        Add the per-patch / per-frame learned encodings (upstream config flags).
    layer_norm_eps : float
        The encoder layers' LayerNorm epsilon.

    Returns
    -------
    out, cache
        ``out (B, P, C, pH, pW)``: the prediction of every pair's target from the pairs before it
        and its own condition.
    """
    init, end, p, heads, layers, dt = _validate(init, end, params, num_heads, patch_num, use_patch_pos_encoding,
                                                use_func_pos_encoding)
    b, pairs, c, hh, ww = init.shape
    pn = int(patch_num)
    ps = (hh // pn, ww // pn)
    frames = np.stack([init, end], axis=2).reshape(b * pairs * 2, c, hh, ww)
    tok_in = patchify(frames, ps)                                        # (B*P*2, p*p, C*h*w)
    t = linear_apply(tok_in, p["pre_proj.weight"], p["pre_proj.bias"])
    if "patch_pos_encoding" in p and use_patch_pos_encoding:
        t = t + p["patch_pos_encoding"]
    t = t.reshape(b, pairs * 2, pn * pn, -1)
    if "func_pos_encoding" in p and use_func_pos_encoding:
        t = t + p["func_pos_encoding"][:2 * pairs, None, :]
    d = t.shape[-1]
    h = t.reshape(b, pairs * 2 * pn * pn, d)
    mask = in_context_mask(pairs, pn * pn, pn * pn)
    caches = []
    for i in range(layers):
        pre = _LAYER.format(i)
        att, ca = mha_forward(h, None, _mha_params(p, pre), num_heads=heads, attn_mask=mask)
        x1, c1 = norm_forward(p, f"{pre}.norm1", h + att, eps=layer_norm_eps)
        ff, cf = mlp_forward(p, x1, fc1=f"{pre}.linear1", fc2=f"{pre}.linear2", activation="gelu")
        h, c2 = norm_forward(p, f"{pre}.norm2", x1 + ff, eps=layer_norm_eps)
        caches.append((pre, ca, c1, cf, c2))
    cond = h.reshape(b, pairs, 2, pn * pn, d)[:, :, 0]
    y = linear_apply(cond, p["post_proj.weight"], p["post_proj.bias"])
    out = unpatchify(y.reshape(b * pairs, pn * pn, -1), ps, c, (pn, pn)).reshape(init.shape)
    cache = {"p": p, "tok_in": tok_in, "cond": cond, "caches": caches, "shape": init.shape, "ps": ps, "pn": pn,
             "flags": (use_patch_pos_encoding, use_func_pos_encoding), "dt": dt}
    return out, cache


def vicon_backward(dout, cache):
    """Gradients of :func:`vicon_forward`: ``init``, ``end`` and every params key."""
    p, pn, ps = cache["p"], cache["pn"], cache["ps"]
    b, pairs, c, hh, ww = cache["shape"]
    g = as_dout(dout, cache["shape"], cache["dt"])
    grads = {}
    gy = patchify(g.reshape(b * pairs, c, hh, ww), ps).reshape(b, pairs, pn * pn, -1)
    r = linear_vjp(gy, cache["cond"], p["post_proj.weight"])
    grads["post_proj.weight"], grads["post_proj.bias"] = r["weight"], r["bias"]
    d = r["x"].shape[-1]
    gh = np.zeros((b, pairs, 2, pn * pn, d), dtype=g.dtype)
    gh[:, :, 0] = r["x"]
    gh = gh.reshape(b, -1, d)
    for pre, ca, c1, cf, c2 in reversed(cache["caches"]):
        dz = norm_backward(grads, p, gh, c2)
        da = norm_backward(grads, p, dz + mlp_backward(grads, p, dz, cf), c1)
        ra = mha_backward(da, ca)
        grads[f"{pre}.self_attn.in_proj_weight"] = np.concatenate([ra["q_proj"], ra["k_proj"], ra["v_proj"]], axis=1)
        grads[f"{pre}.self_attn.in_proj_bias"] = np.concatenate([ra["q_proj_bias"], ra["k_proj_bias"],
                                                                 ra["v_proj_bias"]])
        grads[f"{pre}.self_attn.out_proj.weight"] = ra["out_proj"]
        grads[f"{pre}.self_attn.out_proj.bias"] = ra["out_proj_bias"]
        gh = da + ra["x"]
    gt = gh.reshape(b, pairs * 2, pn * pn, d)
    use_patch, use_func = cache["flags"]
    if "func_pos_encoding" in p:
        gf = np.zeros_like(p["func_pos_encoding"])
        if use_func:
            gf[:2 * pairs] = gt.sum(axis=(0, 2))
        grads["func_pos_encoding"] = gf
    gt = gt.reshape(b * pairs * 2, pn * pn, d)
    if "patch_pos_encoding" in p:
        grads["patch_pos_encoding"] = gt.sum(axis=0) if use_patch else np.zeros_like(p["patch_pos_encoding"])
    r = linear_vjp(gt, cache["tok_in"], p["pre_proj.weight"])
    grads["pre_proj.weight"], grads["pre_proj.bias"] = r["weight"], r["bias"]
    frames = unpatchify(r["x"], ps, c, (pn, pn)).reshape(b, pairs, 2, c, hh, ww)
    grads["init"], grads["end"] = frames[:, :, 0].copy(), frames[:, :, 1].copy()
    return grads


def vicon(init, end, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`vicon_forward`."""
    return vicon_forward(init, end, params, **config)[0]


def init_vicon_params(rng, channels: int, patch_size, patch_num: int, dim_token: int, num_layers: int = 1, *,
                      dim_feedforward: int, demo_num: int, dtype=np.float64) -> dict:
    """PyTorch-default initialisation: Linear $U(\\pm1/\\sqrt{\\text{in}})$, ``in_proj_weight``
    xavier-uniform with zero in/out-projection biases, LayerNorm 1/0, encodings $N(0, 1)$."""
    shapes = vicon_param_shapes(channels, patch_size, patch_num, dim_token, num_layers,
                                dim_feedforward=dim_feedforward, demo_num=demo_num)
    p = init_torch_default(rng, shapes, normal=("pos_encoding",), norm=(".norm",))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        b, pairs, c, ps, pn, d, heads, ff, layers, demo = 2, 2, 1, (1, 1), 2, 4, 2, 3, 1, 2
    else:
        b, pairs, c, ps, pn, d, heads, ff, layers, demo = 2, 3, 2, (2, 1), 2, 6, 2, 8, 2, 4
    p = init_vicon_params(rng, c, ps, pn, d, layers, dim_feedforward=ff, demo_num=demo)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    shape = (b, pairs, c, pn * ps[0], pn * ps[1])
    return Sample(inputs={"init": rng.standard_normal(shape), "end": rng.standard_normal(shape)}, params=p,
                  config={"num_heads": heads, "patch_num": pn})


def _reference(init, end, params, *, num_heads, patch_num, use_patch_pos_encoding=True, use_func_pos_encoding=True,
               layer_norm_eps=1e-5):
    # Dense formula with explicit loops over pairs/patches and a -inf mask from the membership rule.
    b, pairs, c, hh, ww = init.shape
    pn, p = patch_num, params
    h_, w_ = hh // pn, ww // pn
    toks, owner = [], []
    for i in range(pairs):
        for r, f in enumerate((init[:, i], end[:, i])):
            for a in range(pn):
                for e in range(pn):
                    v = f[:, :, a * h_:(a + 1) * h_, e * w_:(e + 1) * w_].reshape(b, -1) @ p["pre_proj.weight"]
                    v = v + p["pre_proj.bias"]
                    if use_patch_pos_encoding:
                        v = v + p["patch_pos_encoding"][a * pn + e]
                    if use_func_pos_encoding:
                        v = v + p["func_pos_encoding"][2 * i + r]
                    toks.append(v)
                    owner.append((i, r))
    h = np.stack(toks, axis=1)
    n = len(owner)
    allowed = np.array([[o2[0] < o1[0] or (o2[0] == o1[0] and (o1[1] == 1 or o2[1] == 0)) for o2 in owner]
                        for o1 in owner])
    d = h.shape[-1]
    dh = d // num_heads

    def ln(x, pre):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + layer_norm_eps) * p[f"{pre}.weight"] \
            + p[f"{pre}.bias"]

    i = 0
    while f"{_LAYER.format(i)}.self_attn.in_proj_weight" in p:
        pre = _LAYER.format(i)
        qkv = h @ p[f"{pre}.self_attn.in_proj_weight"] + p[f"{pre}.self_attn.in_proj_bias"]
        heads_out = []
        for hd in range(num_heads):
            q, k, v = (qkv[..., j * d + hd * dh: j * d + (hd + 1) * dh] for j in range(3))
            s = q @ np.swapaxes(k, -1, -2) / np.sqrt(dh)
            s = np.where(allowed, s, -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            heads_out.append(a / a.sum(-1, keepdims=True) @ v)
        att = np.concatenate(heads_out, -1) @ p[f"{pre}.self_attn.out_proj.weight"] + p[f"{pre}.self_attn.out_proj.bias"]
        x1 = ln(h + att, f"{pre}.norm1")
        u = x1 @ p[f"{pre}.linear1.weight"] + p[f"{pre}.linear1.bias"]
        ff = (0.5 * u * (1 + erf(u / np.sqrt(2)))) @ p[f"{pre}.linear2.weight"] + p[f"{pre}.linear2.bias"]
        h = ln(x1 + ff, f"{pre}.norm2")
        i += 1
    out = np.zeros_like(init)
    for t in range(n):
        i, r = owner[t]
        if r == 0:
            j = t - 2 * i * pn * pn
            a, e = divmod(j, pn)
            y = h[:, t] @ p["post_proj.weight"] + p["post_proj.bias"]
            out[:, i, :, a * h_:(a + 1) * h_, e * w_:(e + 1) * w_] = y.reshape(b, c, h_, w_)
    return out


def _brute_mask(pairs, s1, s2):
    n = pairs * (s1 + s2)
    keep = np.zeros((n, n), bool)
    for s in range(n):
        for t in range(n):
            i_s, o_s = divmod(s, s1 + s2)
            i_t, o_t = divmod(t, s1 + s2)
            keep[s, t] = i_t < i_s or (i_t == i_s and (o_s >= s1 or o_t < s1))
    return keep


def _check_mask(rng):
    # The mask against the membership rule, and against upstream's docstring example
    # (block_num 3, sizes 2 and 1), and prefix-consistency (cutting the demo_num mask to P pairs).
    for pairs, s1, s2 in ((1, 1, 1), (3, 2, 1), (4, 3, 2), (2, 4, 4)):
        assert np.array_equal(in_context_mask(pairs, s1, s2), _brute_mask(pairs, s1, s2)), (pairs, s1, s2)
    rows = ["110000000", "110000000", "111000000", "111110000", "111110000", "111111000", "111111110",
            "111111110", "111111111"]
    assert np.array_equal(in_context_mask(3, 2, 1), np.array([[ch == "1" for ch in r] for r in rows]))
    big = in_context_mask(5, 3, 3)
    assert np.array_equal(big[:12, :12], in_context_mask(2, 3, 3))
    return 0.0


def _check_prediction_is_in_context(rng):
    # The prediction of pair i does not move when its own target or any later pair changes, and
    # does move with the earlier pairs' targets (the in-context examples).
    s = _sample(rng, "small")
    init, end = s.inputs["init"], s.inputs["end"]
    base = vicon(init, end, s.params, **s.config)
    pairs = init.shape[1]
    worst = 0.0
    for i in range(pairs):
        e2, i2 = end.copy(), init.copy()
        e2[:, i:] += rng.standard_normal(e2[:, i:].shape)
        i2[:, i + 1:] += rng.standard_normal(i2[:, i + 1:].shape)
        out = vicon(i2, e2, s.params, **s.config)
        err = float(np.abs(out[:, :i + 1] - base[:, :i + 1]).max())
        assert err < 1e-12, f"pair {i}'s prediction sees its own target or a later pair: {err:.2e}"
        worst = max(worst, err)
        if i + 1 < pairs:
            assert np.abs(out[:, i + 1:] - base[:, i + 1:]).max() > 1e-6, "later pairs ignore the earlier examples"
    return worst


register(
    Mechanism(
        slug="vicon_in_context_operator", family="3-operator", tier="T3",
        title="VICON: in-context masked patch transformer over (condition, target) frame pairs",
        paper="Cao, Liu, Yang, Yu, Schaeffer, Osher, VICON: Vision In-Context Operator Networks for Multi-Physics "
              "Fluid Dynamics Prediction, TMLR 2026, arXiv 2411.16063",
        forward=vicon_forward, backward=vicon_backward, sample=_sample, reference=_reference,
        docs="operators/o5b.md#vicon-in-context-masked-patch-transformer",
        checks={"in_context_mask": _check_mask, "prediction_is_in_context": _check_prediction_is_in_context},
    ),
)
