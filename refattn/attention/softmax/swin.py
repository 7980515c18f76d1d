r"""(Shifted-)window attention of the Swin Transformer (V1 relative-bias table, V2 scaled cosine + CPB).

This module is refattn's single implementation of Swin-style window attention: the Poseidon/scOT
layer (`refattn.operators.scot`) and HAT's hybrid attention block
(`refattn.attention.softmax.hat`) call `swin_window_attention_apply` /
`swin_window_attention_vjp`.

Papers: Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
ICCV 2021, arXiv 2103.14030; Liu et al., "Swin Transformer V2: Scaling Up Capacity and
Resolution", CVPR 2022, arXiv 2111.09883. Upstream: microsoft/Swin-Transformer
``models/swin_transformer.py`` and ``models/swin_transformer_v2.py``
@f82860bfb5225915aca09c3227159ee9e1df874d (``WindowAttention`` and the shift/mask of
``SwinTransformerBlock``); Hugging Face ``transformers`` ``models/swin/modeling_swin.py`` and
``models/swinv2/modeling_swinv2.py`` (v5.24.0: ``SwinSelfAttention``/``Swinv2SelfAttention``,
``maybe_pad``, ``get_attn_mask``).

Forward (``x (B, H, W, C)``, window $M = (M_h, M_w)$, shift $s$)
------------------------------------------------------------------
1. *Windows.* Pad $H, W$ at the end with zeros to multiples of $M$ (HF ``maybe_pad``; microsoft's
   code asserts divisibility, where padding is a no-op), roll the grid by $(-s_h, -s_w)$ and cut it
   into $nW$ windows of $N = M_hM_w$ tokens: `refattn.nn.windows.window_partition_apply`.
2. *Projections* per window token: $q = xW_q + b_q$, $k = xW_k + b_k$, $v = xW_v + b_v$, split into
   $H_a$ heads of width $d = C/H_a$.
3. *Scores* per window and head:

   * V1: $S = s\,qk^\top + B$, $s = d^{-1/2}$ (``qk_scale``), $B_{h,ij} = \beta[\iota_{ij}, h]$ with the
     ``relative_position_bias_table`` $\beta$ of $(2M_h-1)(2M_w-1)$ rows and Swin's index
     $\iota_{ij} = (\Delta h + M_h - 1)(2M_w-1) + (\Delta w + M_w - 1)$
     (`refattn.nn.windows.relative_position_index`);
   * V2: $S = \tau_h\,\hat q\hat k^\top + 16\,\sigma(c[\iota_{ij}, h])$ with
     $\hat q = q/\max(\lVert q\rVert, 10^{-12})$ (``F.normalize``), $\tau_h = \exp(\min(\lambda_h,\log 100))$
     (``logit_scale``, init $\log 10$) and the continuous position bias
     $c = \mathrm{ReLU}(TW_0 + b_0)W_2$ of SwinV2's log-spaced coordinate table $T$
     (`refattn.nn.windows.swinv2_relative_coords_table`, ``pretrained_window_size``).

4. *Shift mask.* When $s \ne 0$, tokens of one window that come from different regions of the
   unrolled image get ``mask_value`` added (−100 in Swin, HF and scOT; −inf is exact
   exclusion), `refattn.nn.windows.shifted_window_mask` on the padded grid. HF's
   ``Swinv2SelfAttention`` adds the mask twice (``mask_added_twice=True``; scOT inherits it);
   microsoft adds it once.
5. $P = \mathrm{softmax}(S)$, $O = PV$, heads merged, $Y = OW_o + b_o$; windows back on the grid,
   roll by $+s$, crop the padding (`refattn.nn.windows.window_reverse_apply`).

Window rule (``window_rule``): ``"microsoft"`` (default; also HF Swin V1): when
$\min(H, W) \le M$ the window becomes $\min(H, W)$ and the shift 0 (the block's
``if min(self.input_resolution) <= self.window_size``); ``"none"`` uses the given window as is.
With the rule, a window covering a square grid is global attention (a named check).

Backward (derivation)
---------------------
Windowing, rolling, padding and cropping are fixed linear selections: partition is a zero-pad,
a roll and a permutation, and reverse is its adjoint, so the gradient of a windowed tensor goes
back through `window_reverse_apply` and vice versa. The selection itself (which tokens share a
window, which pairs are masked) is held fixed: the backward is the gradient of the selected
computation; a masked pair with a finite fill still carries its $e^{-100}$ weight and gradient.

With $G = \partial L/\partial Y$ on the windows: $dW_o = O^\top G$, $dO = GW_o^\top$,
$dV = P^\top dO$, $dP = dO\,V^\top$, $dS = P\odot(dP - \mathrm{rowsum}(P\odot dP))$
(`refattn.nn.softmax.softmax_vjp`).

* V1: $dq = s\,dS\,k$, $dk = dS^\top(sq)$, $d\beta = $ the scatter-add of $dS$ summed over batch and
  windows into the table rows (`refattn.nn.windows.relative_position_bias_vjp`).
* V2: $d\hat q = \tau\,dS\,\hat k$, $d\hat k = \tau\,dS^\top\hat q$, the normalisation VJP
  $dq = (d\hat q - \hat q\langle\hat q, d\hat q\rangle)/\lVert q\rVert$;
  $d\lambda_h = \tau_h[\lambda_h < \log 100]\sum dS\odot\hat q\hat k^\top$ (the clamp passes no
  gradient above $\log 100$); $dc$ = the scatter-add of $16\,\sigma(1-\sigma)\,dS$, then the
  Linear–ReLU–Linear VJP: $dW_2 = \mathrm{ReLU}(h_1)^\top dc$,
  $dh_1 = (dc\,W_2^\top)[h_1 > 0]$, $dW_0 = T^\top dh_1$, $db_0 = \sum dh_1$.

Then $dW_q = X_w^\top dq$ etc. and $dX_w = dq\,W_q^\top + dk\,W_k^\top + dv\,W_v^\top$, which goes
back to the grid through the adjoint of the partition.

Parameter names (``param_names``)
---------------------------------
``"microsoft"`` (``WindowAttention``): ``qkv.weight (C, 3C)`` (torch ``weight.T``, columns q | k | v),
V1 ``qkv.bias (3C,)``, V2 ``q_bias``/``v_bias (C,)`` (the key bias is fixed at zero),
``relative_position_bias_table`` (V1), ``logit_scale (H_a, 1, 1)``, ``cpb_mlp.0.weight (2, 512)``,
``cpb_mlp.0.bias``, ``cpb_mlp.2.weight (512, H_a)`` (V2), ``proj.weight``, ``proj.bias``.
``"hf"`` (``SwinAttention``/``Swinv2Attention``): ``self.query.weight`` … ``self.value.bias`` (V2: no
key bias), ``self.relative_position_bias_table`` or ``self.logit_scale`` and
``self.continuous_position_bias_mlp.{0,2}.*``, ``output.dense.weight``/``.bias``. Biases are
optional (``qkv_bias=False``).

Measured agreement with upstream (float64, CPU, torch 2.13; scratch script, not committed):
microsoft ``WindowAttention`` + ``SwinTransformerBlock`` shift/mask (V1 and V2) and HF
``SwinSelfAttention``/``Swinv2SelfAttention`` through ``SwinLayer``/``Swinv2Layer`` with padding:
see the docs page ``docs/softmax/vision-attention.md`` for the numbers.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.activations import sigmoid
from ...nn.conv import check_int_tuple
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...nn.windows import (
    relative_position_bias,
    relative_position_bias_vjp,
    relative_position_index,
    shifted_window_mask,
    swinv2_relative_coords_table,
    window_partition_apply,
    window_reverse_apply,
)
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "SWIN_VERSIONS",
    "SWIN_PARAM_NAMES",
    "SWIN_WINDOW_RULES",
    "swin_param_spec",
    "init_swin_params",
    "swin_window_and_shift",
    "swin_canonical_weights",
    "swin_named_grads",
    "swin_window_attention_apply",
    "swin_window_attention_vjp",
    "swin_window_attention_forward",
    "swin_window_attention_backward",
    "swin_window_attention",
]

SWIN_VERSIONS = ("v1", "v2")
SWIN_PARAM_NAMES = ("microsoft", "hf")
SWIN_WINDOW_RULES = ("microsoft", "none")
_LOG100 = math.log(100.0)

# canonical name -> upstream name (None: part of a fused microsoft qkv tensor)
_HF = {"wq": "self.query.weight", "bq": "self.query.bias", "wk": "self.key.weight", "bk": "self.key.bias",
       "wv": "self.value.weight", "bv": "self.value.bias", "table": "self.relative_position_bias_table",
       "ls": "self.logit_scale", "w0": "self.continuous_position_bias_mlp.0.weight",
       "b0": "self.continuous_position_bias_mlp.0.bias", "w2": "self.continuous_position_bias_mlp.2.weight",
       "wo": "output.dense.weight", "bo": "output.dense.bias"}
_MS = {"table": "relative_position_bias_table", "ls": "logit_scale", "w0": "cpb_mlp.0.weight",
       "b0": "cpb_mlp.0.bias", "w2": "cpb_mlp.2.weight", "wo": "proj.weight", "bo": "proj.bias"}


# --------------------------------------------------------------------------------------------
# Parameter names and shapes


def swin_param_spec(dim: int, num_heads: int, window_size, *, version: str = "v1", param_names: str = "microsoft",
                    cpb_hidden: int = 512, out_dim=None) -> tuple[dict, tuple]:
    """``(spec, optional)``: upstream parameter names -> shapes (``W (in, out)``), and the optional keys.

    ``window_size`` is the *effective* window (after the window rule), an int or ``(M_h, M_w)``."""
    check_choice(version, "version", SWIN_VERSIONS)
    check_choice(param_names, "param_names", SWIN_PARAM_NAMES)
    m = check_int_tuple(window_size, 2, "window_size", minimum=1)
    c, h, co = dim, num_heads, dim if out_dim is None else out_dim
    rows = (2 * m[0] - 1) * (2 * m[1] - 1)
    pos = {"table": (rows, h)} if version == "v1" else \
        {"ls": (h, 1, 1), "w0": (2, cpb_hidden), "b0": (cpb_hidden,), "w2": (cpb_hidden, h)}
    if param_names == "hf":
        spec = {_HF["wq"]: (c, c), _HF["bq"]: (c,), _HF["wk"]: (c, c)}
        if version == "v1":
            spec[_HF["bk"]] = (c,)
        spec.update({_HF["wv"]: (c, c), _HF["bv"]: (c,)})
        spec.update({_HF[k]: s for k, s in pos.items()})
        spec.update({_HF["wo"]: (c, co), _HF["bo"]: (co,)})
        optional = tuple(_HF[k] for k in ("bq", "bk", "bv", "bo") if _HF[k] in spec)
    else:
        spec = {"qkv.weight": (c, 3 * c)}
        spec.update({"qkv.bias": (3 * c,)} if version == "v1" else {"q_bias": (c,), "v_bias": (c,)})
        spec.update({_MS[k]: s for k, s in pos.items()})
        spec.update({"proj.weight": (c, co), "proj.bias": (co,)})
        optional = ("qkv.bias", "proj.bias") if version == "v1" else ("q_bias", "v_bias", "proj.bias")
    return spec, optional


def init_swin_params(rng, dim: int, num_heads: int, window_size, *, version: str = "v1",
                     param_names: str = "microsoft", cpb_hidden: int = 512, qkv_bias: bool = True) -> dict:
    """Random parameters: linear weights $U(\\pm 1/\\sqrt{in})$, biases $0.1\\,\\mathcal N$, bias table
    $0.5\\,\\mathcal N$, ``logit_scale`` $\\log 10 + 0.3\\,\\mathcal N$ (below $\\log 100$)."""
    spec, optional = swin_param_spec(dim, num_heads, window_size, version=version, param_names=param_names,
                                     cpb_hidden=cpb_hidden)
    p = {}
    for k, shp in spec.items():
        if k in optional and not qkv_bias and not k.endswith(("proj.bias", "dense.bias")):
            continue
        if k.endswith("logit_scale"):
            p[k] = math.log(10.0) + 0.3 * rng.standard_normal(shp)
        elif k.endswith("bias_table"):
            p[k] = 0.5 * rng.standard_normal(shp)
        elif len(shp) == 2:
            p[k] = rng.uniform(-1.0, 1.0, shp) / math.sqrt(shp[0])
        else:
            p[k] = 0.1 * rng.standard_normal(shp)
    return p


def swin_canonical_weights(params: dict, *, version: str, param_names: str) -> dict:
    """Map upstream names to the canonical keys of `swin_window_attention_apply` (unvalidated).

    Keys ``wq, bq, wk, bk, wv, bv, wo, bo`` (absent biases are ``None``) and ``table`` (V1) or
    ``ls (H_a,), w0, b0, w2`` (V2). A fused microsoft ``qkv`` tensor is sliced into views."""
    if param_names == "hf":
        w = {k: params.get(v) for k, v in _HF.items()}
    else:
        qkv, c = params["qkv.weight"], params["qkv.weight"].shape[0]
        w = {"wq": qkv[:, :c], "wk": qkv[:, c:2 * c], "wv": qkv[:, 2 * c:]}
        if version == "v1":
            b = params.get("qkv.bias")
            w.update({"bq": None, "bk": None, "bv": None} if b is None else
                     {"bq": b[:c], "bk": b[c:2 * c], "bv": b[2 * c:]})
        else:
            w.update({"bq": params.get("q_bias"), "bk": None, "bv": params.get("v_bias")})
        w.update({k: params.get(v) for k, v in _MS.items()})
    if version == "v2":
        w["ls"] = w["ls"].reshape(-1)
    return w


def swin_named_grads(cg: dict, params: dict, *, version: str, param_names: str) -> dict:
    """Canonical gradients (of `swin_window_attention_vjp`) back under the upstream names present in
    ``params`` (the inverse of `swin_canonical_weights`; fused microsoft tensors are concatenated)."""
    out = {}
    if param_names == "hf":
        for k, name in _HF.items():
            if name in params and params[name] is not None:
                out[name] = cg[k]
    else:
        out["qkv.weight"] = np.concatenate([cg["wq"], cg["wk"], cg["wv"]], axis=1)
        if version == "v1" and params.get("qkv.bias") is not None:
            out["qkv.bias"] = np.concatenate([cg["bq"], cg["bk"], cg["bv"]])
        if version == "v2":
            for k, name in (("bq", "q_bias"), ("bv", "v_bias")):
                if params.get(name) is not None:
                    out[name] = cg[k]
        for k, name in _MS.items():
            if name in params and params[name] is not None:
                out[name] = cg[k]
    if version == "v2":
        ls_name = _HF["ls"] if param_names == "hf" else _MS["ls"]
        out[ls_name] = out[ls_name].reshape(-1, 1, 1)
    return out


def swin_window_and_shift(resolution, window_size, shift_size, rule: str = "microsoft"):
    """Effective ``(window, shift)`` tuples for a grid ``resolution = (H, W)``.

    ``"microsoft"``: if $\\min(H, W) \\le M$ (a square window), the window becomes $\\min(H, W)$ and
    the shift 0 (``SwinTransformerBlock.__init__``; HF ``SwinLayer.set_shift_and_window_size``).
    ``"none"``: unchanged."""
    check_choice(rule, "window_rule", SWIN_WINDOW_RULES)
    m = check_int_tuple(window_size, 2, "window_size", minimum=1)
    s = check_int_tuple(shift_size, 2, "shift_size")
    if rule == "microsoft":
        if m[0] != m[1]:
            raise ValueError(f"window_rule='microsoft' needs a square window; got window_size {window_size!r} "
                             f"(pass window_rule='none')")
        if min(resolution) <= m[0]:
            m, s = (min(resolution),) * 2, (0, 0)
    if any(si >= mi for si, mi in zip(s, m)):
        raise ValueError(f"shift_size must be smaller than the window on every axis; got shift_size {s}, window {m}")
    return m, s


# --------------------------------------------------------------------------------------------
# The unvalidated core (shared with scOT and HAT)


@functools.lru_cache(maxsize=64)
def _geometry(grid, window, shift, fill, dtype, pretrained):
    """Read-only (relative index, shift mask (nW, 1, N, N) or None, V2 coordinate table) of a layer
    geometry; cached because the block records call the layer many times at one geometry."""
    idx = relative_position_index(window)
    mask = None
    if any(shift):
        mask = shifted_window_mask(grid, window, shift, fill_value=fill, dtype=np.dtype(dtype))[:, None]
    coords = swinv2_relative_coords_table(window, pretrained).astype(dtype)
    for a in (idx, mask, coords):
        if a is not None:
            a.setflags(write=False)
    return idx, mask, coords


def swin_window_attention_apply(x, w, *, num_heads: int, window, shift, version: str = "v1", scale=None,
                                mask_value: float = -100.0, mask_added_twice: bool = False,
                                pretrained_window_size=0):
    r"""Unvalidated (shifted-)window attention on a grid ``x (B, H, W, C)`` with canonical weights
    ``w`` (see `swin_canonical_weights`), effective ``window``/``shift`` tuples. Returns ``(y, cache)``,
    ``y (B, H, W, C_out)``; `swin_window_attention_vjp` is its VJP."""
    b, hh, ww, _ = x.shape
    dt = x.dtype
    nh = num_heads
    d = w["wq"].shape[1] // nh
    xw = window_partition_apply(x, window, shift)                             # (B, nW, N, C)
    q = split_heads(linear_apply(xw, w["wq"], w["bq"]), nh, d)               # (B, nW, nh, N, d)
    k = split_heads(linear_apply(xw, w["wk"], w["bk"]), nh, d)
    v = split_heads(linear_apply(xw, w["wv"], w["bv"]), nh, w["wv"].shape[1] // nh)
    fill = (2.0 if mask_added_twice else 1.0) * mask_value
    idx, mask, coords = _geometry((hh, ww), tuple(window), tuple(shift), fill, np.dtype(dt).str,
                                  check_int_tuple(pretrained_window_size, 2, "pretrained_window_size"))
    cache = {"xw": xw, "q": q, "k": k, "v": v, "idx": idx, "w": w, "nh": nh, "window": window, "shift": shift,
             "version": version, "grid": (hh, ww)}
    if version == "v1":
        s_ = float(d ** -0.5) if scale is None else float(scale)
        qs = q * s_                                                            # microsoft scales q first
        s = qs @ np.swapaxes(k, -1, -2) + relative_position_bias(w["table"], idx)
        cache.update(qs=qs, scale=s_)
    else:
        qn = np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
        kn = np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-12)
        qh, kh = q / qn, k / kn
        tau = np.exp(np.minimum(w["ls"], _LOG100))
        cos = qh @ np.swapaxes(kh, -1, -2)
        h1 = coords @ w["w0"] + w["b0"]
        sig = sigmoid(relative_position_bias(np.maximum(h1, 0.0) @ w["w2"], idx))   # (nh, N, N)
        s = tau[:, None, None] * cos + 16.0 * sig
        cache.update(qn=qn, kn=kn, qh=qh, kh=kh, tau=tau, cos=cos, coords=coords, h1=h1, sig=sig)
    if mask is not None:
        s = s + mask
    p, _ = softmax_lse(s, axis=-1)
    om = merge_heads(p @ v)                                                    # (B, nW, N, nh*dv)
    y = linear_apply(om, w["wo"], w["bo"])
    cache.update(p=p, om=om)
    return window_reverse_apply(y, window, (hh, ww), shift), cache


def swin_window_attention_vjp(dy, cache) -> dict:
    """VJP of `swin_window_attention_apply`: canonical gradients ``{"x", "wq", ... }`` (``None``
    for absent biases); derivation in the module docstring."""
    w, nh, window, shift = cache["w"], cache["nh"], cache["window"], cache["shift"]
    gw = window_partition_apply(dy, window, shift)
    g = {}
    lo = linear_vjp(gw, cache["om"], w["wo"], w["bo"] is not None)
    g["wo"], g["bo"] = lo["weight"], lo.get("bias")
    p, k, v = cache["p"], cache["k"], cache["v"]
    do = split_heads(lo["x"], nh, v.shape[-1])
    dv = np.swapaxes(p, -1, -2) @ do
    ds = softmax_vjp(p, do @ np.swapaxes(v, -1, -2))
    idx = cache["idx"]
    if cache["version"] == "v1":
        g["table"] = relative_position_bias_vjp(ds, idx, w["table"].shape[0])
        dq = cache["scale"] * (ds @ k)
        dk = np.swapaxes(ds, -1, -2) @ cache["qs"]
    else:
        tau, ls, cos, qh, kh = cache["tau"], w["ls"], cache["cos"], cache["qh"], cache["kh"]
        g["ls"] = np.einsum("bwhij,bwhij->h", ds, cos) * tau * (ls < _LOG100)
        sig, h1 = cache["sig"], cache["h1"]
        dsig = 16.0 * np.sum(ds, axis=(0, 1)) * sig * (1.0 - sig)
        dcpb = relative_position_bias_vjp(dsig, idx, h1.shape[0])
        g["w2"] = np.maximum(h1, 0.0).T @ dcpb
        dh1 = (dcpb @ w["w2"].T) * (h1 > 0)
        g["w0"] = cache["coords"].T @ dh1
        g["b0"] = dh1.sum(0)
        dcos = ds * tau[:, None, None]
        dqh = dcos @ kh
        dkh = np.swapaxes(dcos, -1, -2) @ qh
        dq = (dqh - qh * np.sum(qh * dqh, -1, keepdims=True)) / cache["qn"]
        dk = (dkh - kh * np.sum(kh * dkh, -1, keepdims=True)) / cache["kn"]
    xw = cache["xw"]
    dxw = 0.0
    for name, dz in (("q", dq), ("k", dk), ("v", dv)):
        lz = linear_vjp(merge_heads(dz), xw, w["w" + name], w["b" + name] is not None)
        g["w" + name], g["b" + name] = lz["weight"], lz.get("bias")
        dxw = dxw + lz["x"]
    g["x"] = window_reverse_apply(dxw, window, cache["grid"], shift)
    return g


# --------------------------------------------------------------------------------------------
# The validated layer


def _validate(x, params, num_heads, window_size, shift_size, version, param_names, scale, mask_value,
              mask_added_twice, pretrained_window_size, window_rule):
    x = as_float(x, "x", ndim=4)
    num_heads = check_size(num_heads, "num_heads")
    check_choice(version, "version", SWIN_VERSIONS)
    check_choice(param_names, "param_names", SWIN_PARAM_NAMES)
    c = x.shape[-1]
    if c % num_heads:
        raise ValueError(f"channels of x ({c}) must be divisible by num_heads ({num_heads})")
    window, shift = swin_window_and_shift(x.shape[1:3], window_size, shift_size, window_rule)
    scale = check_positive(scale, "scale", allow_none=True)
    if not isinstance(mask_value, (int, float, np.floating)) or isinstance(mask_value, bool) \
            or np.isnan(mask_value) or mask_value > 0:
        raise ValueError(f"mask_value must be a number <= 0 (-100 as upstream, or -inf); got {mask_value!r}")
    if not isinstance(mask_added_twice, (bool, np.bool_)):
        raise TypeError(f"mask_added_twice must be a bool; got {type(mask_added_twice).__name__}")
    check_int_tuple(pretrained_window_size, 2, "pretrained_window_size")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of the upstream parameters (see swin_param_spec); "
                        f"got {type(params).__name__}")
    cpb_key = _HF["b0"] if param_names == "hf" else _MS["b0"]
    cpb_hidden = np.shape(params.get(cpb_key))[0] if version == "v2" and np.ndim(params.get(cpb_key)) == 1 else 512
    out_key = _HF["wo"] if param_names == "hf" else _MS["wo"]
    out_dim = np.shape(params[out_key])[-1] if np.ndim(params.get(out_key)) == 2 else None
    spec, optional = swin_param_spec(c, num_heads, window, version=version, param_names=param_names,
                                     cpb_hidden=cpb_hidden, out_dim=out_dim)
    p = check_params(params, spec, optional=optional, where=f"swin_window_attention ({version}, {param_names} names)")
    if version == "v2" and param_names == "microsoft" and (p.get("q_bias") is None) != (p.get("v_bias") is None):
        raise ValueError("q_bias and v_bias must be given together (qkv_bias=True) or both left out")
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads, window, shift, scale


def swin_window_attention_forward(x, params, *, num_heads: int, window_size=7, shift_size=0, version: str = "v1",
                                  param_names: str = "microsoft", scale=None, mask_value: float = -100.0,
                                  mask_added_twice: bool = False, pretrained_window_size=0,
                                  window_rule: str = "microsoft"):
    r"""Swin (shifted-)window multi-head self-attention on a token grid (see the module docstring).

    Parameters
    ----------
    x : array (B, H, W, C)
        Tokens on the grid (Swin's ``x.view(B, H, W, C)``); any $H, W$ (zero padding at the end).
    params : dict
        Upstream names (``param_names``, see `swin_param_spec`); weights ``(in, out)`` = torch
        ``weight.T``; tables and ``logit_scale`` as stored.
    num_heads : int
    window_size, shift_size : int or (int, int)
        Window $M$ and shift $s$ (``M // 2`` on odd blocks of a stage, 0 otherwise).
    version : {"v1", "v2"}
        Relative-bias table with $d^{-1/2}$ scores, or SwinV2 scaled cosine + continuous bias.
    param_names : {"microsoft", "hf"}
    scale : float, optional
        V1 score scale (``qk_scale``), default $d^{-1/2}$.
    mask_value : float
        Shift-mask fill: −100 (Swin, HF, scOT) or ``-np.inf``.
    mask_added_twice : bool
        HF ``Swinv2SelfAttention`` (and scOT) add the mask twice; microsoft once (default).
    pretrained_window_size : int or (int, int)
        V2 coordinate normalisation (0: the window itself).
    window_rule : {"microsoft", "none"}
        Shrink the window to the grid and drop the shift when $\min(H, W) \le M$ (upstream), or not.

    Returns
    -------
    out, cache
        ``out (B, H, W, C_out)``.
    """
    x, p, nh, window, shift, scale = _validate(x, params, num_heads, window_size, shift_size, version, param_names,
                                               scale, mask_value, mask_added_twice, pretrained_window_size,
                                               window_rule)
    w = swin_canonical_weights(p, version=version, param_names=param_names)
    y, core = swin_window_attention_apply(x, w, num_heads=nh, window=window, shift=shift, version=version,
                                          scale=scale, mask_value=float(mask_value),
                                          mask_added_twice=bool(mask_added_twice),
                                          pretrained_window_size=pretrained_window_size)
    return y, {"core": core, "p": p, "version": version, "names": param_names, "shape": y.shape}


def swin_window_attention_backward(dout, cache):
    """Gradient of :func:`swin_window_attention_forward`: ``x`` and every given parameter."""
    g = as_dout(dout, cache["shape"], cache["core"]["xw"].dtype)
    cg = swin_window_attention_vjp(g, cache["core"])
    return {"x": cg["x"], **swin_named_grads(cg, cache["p"], version=cache["version"], param_names=cache["names"])}


def swin_window_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`swin_window_attention_forward`."""
    return swin_window_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw(rng, size, version=None, names=None):
    version = version or str(rng.choice(SWIN_VERSIONS))
    names = names or str(rng.choice(SWIN_PARAM_NAMES))
    if size == "tiny":
        b, h, w, c, nh, m, hid = 2, 3, 4, 4, 2, 2, 3
    else:
        b, h, w, c, nh, m, hid = 2, int(rng.integers(5, 8)), int(rng.integers(5, 8)), 6, 2, 3, 8
    while True:
        p = init_swin_params(rng, c, nh, m, version=version, param_names=names, cpb_hidden=hid)
        if version == "v1":
            break
        w0 = p[_HF["w0"] if names == "hf" else _MS["w0"]]
        b0 = p[_HF["b0"] if names == "hf" else _MS["b0"]]
        if np.abs(swinv2_relative_coords_table(m) @ w0 + b0).min() > 1e-3:   # CPB ReLU away from its kink
            break
    cfg = {"num_heads": nh, "window_size": m, "shift_size": m // 2 if rng.random() < 0.75 else 0,
           "version": version, "param_names": names, "mask_added_twice": bool(rng.random() < 0.3)}
    return Sample(inputs={"x": rng.standard_normal((b, h, w, c))}, params=p, config=cfg)


def _sample(rng, size):
    return _draw(rng, size)


def _reference(x, params, *, num_heads, window_size=7, shift_size=0, version="v1", param_names="microsoft",
               scale=None, mask_value=-100.0, mask_added_twice=False, pretrained_window_size=0,
               window_rule="microsoft"):
    # Global attention over the padded, rolled grid: pairs in different windows are excluded, pairs in
    # one window from different regions of the unrolled image get the fill; bias from coordinates.
    w = swin_canonical_weights(params, version=version, param_names=param_names)
    (mh, mw), (sh, sw) = swin_window_and_shift(x.shape[1:3], window_size, shift_size, window_rule)
    b, h, wd, c = x.shape
    hp, wp = -(-h // mh) * mh, -(-wd // mw) * mw
    xp = np.zeros((b, hp, wp, c))
    xp[:, :h, :wd] = x
    xr = np.roll(xp, (-sh, -sw), axis=(1, 2)).reshape(b, hp * wp, c)
    r, cc = np.divmod(np.arange(hp * wp), wp)
    same_win = ((r[:, None] // mh) == (r[None] // mh)) & ((cc[:, None] // mw) == (cc[None] // mw))

    def region(pos, length, m, s):
        return 0 if pos < length - m else (1 if pos < length - s else 2)

    reg = np.array([3 * region(ri, hp, mh, sh) + region(ci, wp, mw, sw) for ri, ci in zip(r, cc)])
    fill = (2.0 if mask_added_twice else 1.0) * mask_value if (sh or sw) else 0.0
    extra = np.where(reg[:, None] != reg[None], fill, 0.0)
    dh, dw = (r % mh)[:, None] - (r % mh)[None], (cc % mw)[:, None] - (cc % mw)[None]
    nh, d = num_heads, c // num_heads
    q, k, v = ((xr @ w[a] + (0.0 if w[bb] is None else w[bb])).reshape(b, -1, nh, d) for a, bb in
               (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
    out = np.zeros((b, hp * wp, nh, d))
    for hd in range(nh):
        if version == "v1":
            logits = (scale or d ** -0.5) * np.einsum("bid,bjd->bij", q[:, :, hd], k[:, :, hd])
            logits = logits + w["table"][(dh + mh - 1) * (2 * mw - 1) + dw + mw - 1, hd]
        else:
            qn, kn = (z[:, :, hd] / np.maximum(np.linalg.norm(z[:, :, hd], axis=-1, keepdims=True), 1e-12)
                      for z in (q, k))
            coords = np.stack([dh * 8.0 / max(mh - 1, 1), dw * 8.0 / max(mw - 1, 1)], -1)
            coords = np.sign(coords) * np.log2(np.abs(coords) + 1.0) / 3.0
            cpb = np.maximum(coords @ w["w0"] + w["b0"], 0.0) @ w["w2"][:, hd]
            tau = math.exp(min(float(w["ls"][hd]), math.log(100.0)))
            logits = tau * np.einsum("bid,bjd->bij", qn, kn) + 16.0 / (1.0 + np.exp(-cpb))
        logits = np.where(same_win, logits + extra, -np.inf)
        pr = np.exp(logits - logits.max(-1, keepdims=True))
        out[:, :, hd] = (pr / pr.sum(-1, keepdims=True)) @ v[:, :, hd]
    y = out.reshape(b, hp * wp, c) @ w["wo"] + (0.0 if w["bo"] is None else w["bo"])
    y = np.roll(y.reshape(b, hp, wp, -1), (sh, sw), axis=(1, 2))
    return y[:, :h, :wd]


def _check_shift_equals_masked_global(rng):
    # The catalogue identity, exactly and with -inf: a shifted layer equals the explicit global
    # attention on the rolled grid with the cross-window pairs removed and cross-region pairs masked.
    err = 0.0
    for version in SWIN_VERSIONS:
        for mv in (-100.0, -np.inf):
            s = _draw(rng, "small", version, "microsoft")
            cfg = dict(s.config, shift_size=1, mask_value=mv, window_size=3)
            x = rng.standard_normal((2, 6, 7, 6))
            got = swin_window_attention(x, s.params, **cfg)
            err = max(err, float(np.abs(got - _reference(x, s.params, **cfg)).max()))
    assert err < 1e-12, f"shifted window attention differs from the masked global attention by {err:.2e}"
    return err


def _check_window_covering_grid_is_global(rng):
    # M >= the (square) grid: Swin's rule makes the window the grid and drops the shift, i.e. global
    # attention with the relative-position bias of the whole grid (4x4 grid: a 7x7-row table).
    from .sdpa import sdpa
    params = init_swin_params(rng, 6, 2, 4, version="v1", param_names="hf")
    x = rng.standard_normal((2, 4, 4, 6))
    got = swin_window_attention(x, params, num_heads=2, window_size=7, shift_size=3, param_names="hf")
    w = swin_canonical_weights(params, version="v1", param_names="hf")
    tok = x.reshape(2, 16, 6)
    q, k, v = (split_heads(tok @ w[a] + w[bb], 2) for a, bb in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
    bias = relative_position_bias(w["table"], relative_position_index(4))
    o = merge_heads(sdpa(q, k, v, attn_mask=bias))
    want = (o @ w["wo"] + w["bo"]).reshape(2, 4, 4, 6)
    err = float(np.abs(got - want).max())
    assert err < 1e-12, f"a window covering the grid differs from global attention by {err:.2e}"
    return err


def _check_cosine_scores_bounded(rng):
    # V2 with a constant position bias (CPB output weights 0): log p_ij - log p_ik = tau (cos_ij - cos_ik),
    # so within a window every log-ratio of weights is bounded by 2 tau.
    s = _draw(rng, "small", "v2", "microsoft")
    p = dict(s.params, **{"cpb_mlp.2.weight": np.zeros_like(s.params["cpb_mlp.2.weight"])})
    x = 3.0 * rng.standard_normal((2, 6, 6, 6))
    _, c = swin_window_attention_forward(x, p, **dict(s.config, shift_size=0))
    logp = np.log(c["core"]["p"])
    spread = logp.max(-1) - logp.min(-1)                                   # (B, nW, H, N)
    tau = np.exp(np.minimum(p["logit_scale"].reshape(-1), math.log(100.0)))
    excess = float((spread - 2 * tau[:, None]).max())
    assert excess <= 1e-12, f"a weight ratio exceeds exp(2 tau) by {excess:.2e}"
    return max(excess, 0.0)


def _check_logit_scale_clamp(rng):
    # Above log(100) the clamp is active: the output does not depend on lambda_h and its gradient is 0.
    s = _draw(rng, "small", "v2", "hf")
    p = dict(s.params, **{_HF["ls"]: np.full((2, 1, 1), math.log(100.0) + 0.5)})
    x = rng.standard_normal((2, 5, 6, 6))
    y, c = swin_window_attention_forward(x, p, **s.config)
    g = swin_window_attention_backward(rng.standard_normal(y.shape), c)[_HF["ls"]]
    y2 = swin_window_attention(x, dict(p, **{_HF["ls"]: p[_HF["ls"]] + 1.0}), **s.config)
    err = max(float(np.abs(g).max()), float(np.abs(y2 - y).max()))
    assert err == 0.0, f"the logit-scale clamp leaks ({err:.2e})"
    return err


def _check_infinite_fill_excludes_regions(rng):
    # mask_value=-inf gives exactly zero weight to pairs from different regions; -100 leaves e^-100-sized
    # weights (the upstream default is -100).
    s = _draw(rng, "small", "v1", "microsoft")
    x = rng.standard_normal((2, 6, 6, 6))
    cfg = dict(s.config, window_size=3, shift_size=1, mask_added_twice=False)
    masked = shifted_window_mask((6, 6), 3, 1, fill_value=-np.inf)[None, :, None] == -np.inf
    p_inf = swin_window_attention_forward(x, s.params, **dict(cfg, mask_value=-np.inf))[1]["core"]["p"]
    p_100 = swin_window_attention_forward(x, s.params, **dict(cfg, mask_value=-100.0))[1]["core"]["p"]
    masked = np.broadcast_to(masked, p_inf.shape)
    leak = float(p_100[masked].max())
    assert masked.any() and np.all(p_inf[masked] == 0.0), "-inf fill left a non-zero weight"
    assert 0.0 < leak < 1e-30, f"-100 fill should leave a tiny positive weight; got {leak:.2e}"
    return leak


register(
    Mechanism(
        slug="swin_window_attention", family="1-softmax", tier="T2",
        title="(Shifted-)window attention with relative bias; SwinV2 scaled-cosine variant",
        paper="Liu et al., Swin Transformer, ICCV 2021, arXiv 2103.14030; Liu et al., Swin Transformer V2, "
              "CVPR 2022, arXiv 2111.09883",
        forward=swin_window_attention_forward, backward=swin_window_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/vision-attention.md#swin-window-attention",
        checks={"shift_equals_masked_global": _check_shift_equals_masked_global,
                "window_covering_grid_is_global": _check_window_covering_grid_is_global,
                "cosine_scores_bounded": _check_cosine_scores_bounded,
                "logit_scale_clamp_zero_grad": _check_logit_scale_clamp,
                "infinite_fill_excludes_regions": _check_infinite_fill_excludes_regions},
    ),
)
