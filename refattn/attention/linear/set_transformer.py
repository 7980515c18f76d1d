r"""Set Transformer blocks: MAB, SAB, ISAB (inducing points) and PMA, with hand-derived backwards.

Lee, Lee, Kim, Kosiorek, Choi, Teh, "Set Transformer: A Framework for Attention-based
Permutation-Invariant Neural Networks", ICML 2019, arXiv 1810.00825. Follows the reference code
juho-lee/set_transformer ``modules.py``@6fdae7f (``MAB``, ``SAB``, ``ISAB``, ``PMA``), which differs
from the paper's equations in several details (all reproduced, the scale as a keyword):

* the residual adds the **projected** query: $O = Q + \mathrm{softmax}(\cdot)V$ per head with
  $Q = XW_q + b_q$ (paper: $X + \mathrm{Multihead}(X, Y, Y)$, with an output projection);
* the score scale is $1/\sqrt{D}$ with $D$ = ``dim_V``, the **full** width, not the head width
  $D/H$ (``scale_dim="full"``; ``"head"`` gives the usual $1/\sqrt{D/H}$);
* the row-wise feed-forward is $O + \mathrm{ReLU}(OW_o + b_o)$ (one layer);
* LayerNorm is optional (``ln=False`` upstream default) and, when on, applied after the
  attention residual (``ln0``) and after the feed-forward residual (``ln1``);
* ``PMA`` applies the MAB to $X$ directly (no separate rFF on $Z$ as in the paper).

MAB forward (one set, $X\in\mathbb R^{n_q\times d_Q}$, $Y\in\mathbb R^{n_k\times d_K}$)
-------------------------------------------------------------------------------------------
$Q = XW_q+b_q$, $K = YW_k+b_k$, $V = YW_v+b_v$ (width $D$), split into $H$ heads of $D/H$
contiguous channels (upstream ``Q.split(dim_split, 2)``); per head
$P_h = \mathrm{softmax}(Q_hK_h^\top/\sqrt{D_s})$, $O_h = Q_h + P_hV_h$; $O$ = heads concatenated;
$O_1 = \mathrm{LN}_0(O)$ (if ``ln``); $O_2 = O_1 + \mathrm{ReLU}(O_1W_o+b_o)$;
out $= \mathrm{LN}_1(O_2)$ (if ``ln``).

Backward
--------
$g_2 = \mathrm{LN}_1^*(g)$; with $r = [O_1W_o+b_o > 0]$: $dW_o = O_1^\top(g_2\odot r)$,
$db_o = \sum g_2\odot r$, $g_1 = g_2 + (g_2\odot r)W_o^\top$; $g_O = \mathrm{LN}_0^*(g_1)$.
Per head: $dV_h = P_h^\top g_{O,h}$, $dP_h = g_{O,h}V_h^\top$,
$dS_h = P_h\odot(dP_h - \mathrm{rowsum}(P_h\odot dP_h))$,
$dQ_h = g_{O,h} + dS_hK_h/\sqrt{D_s}$ (the first term from the residual),
$dK_h = dS_h^\top Q_h/\sqrt{D_s}$; then the three linear VJPs
($dX = dQ\,W_q^\top$, $dW_q = X^\top dQ$ …).
SAB: $X$ is both query and key/value input, so $dX = dX_{\text{query}} + dX_{\text{kv}}$.
ISAB: $H = \mathrm{MAB}_0(I, X)$, out $= \mathrm{MAB}_1(X, H)$: $X$ receives gradient as keys/values
of $\mathrm{MAB}_0$ and as queries of $\mathrm{MAB}_1$; $dH$ from $\mathrm{MAB}_1$'s key/value
path flows into $\mathrm{MAB}_0$. $I$ (and PMA's seeds $S$) are shared across the batch, so their
gradients are summed over it.

Parameters follow the PyTorch state-dict names with refattn's ``(in, out)`` weight layout:
``"fc_q.weight" = mab.fc_q.weight.T``, ``"fc_q.bias"``, … ``"ln0.weight"``, ``"ln0.bias"``,
``"ln1.*"``; ISAB prefixes ``"mab0."``/``"mab1."`` and has ``"I"`` ``(1, m, D)``; PMA prefixes
``"mab."`` and has ``"S"`` ``(1, k, D)`` — the upstream parameter shapes.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.norms import layer_norm_backward, layer_norm_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = ["mab_forward", "mab_backward", "set_transformer_forward", "set_transformer_backward",
           "set_transformer", "BLOCKS"]

BLOCKS = ("mab", "sab", "isab", "pma")
_LIN = ("fc_q", "fc_k", "fc_v", "fc_o")


def _mab_param_names(ln: bool, prefix: str = "") -> list[str]:
    names = [f"{prefix}{m}.{p}" for m in _LIN for p in ("weight", "bias")]
    if ln:
        names += [f"{prefix}{m}.{p}" for m in ("ln0", "ln1") for p in ("weight", "bias")]
    return names


def _get_mab_params(params: dict, prefix: str, dim_q: int, dim_k: int, ln: bool, dtype) -> dict:
    """Validate one MAB's parameters; returns a dict keyed without the prefix."""
    out = {}
    for name in _mab_param_names(ln, prefix):
        if name not in params:
            raise ValueError(f"params is missing {name!r}")
        short = name[len(prefix):]
        is_w = short.endswith(".weight") and short.startswith("fc_")
        out[short] = as_float(params[name], name, ndim=2 if is_w else 1).astype(dtype, copy=False)
    D = out["fc_q.weight"].shape[1]
    expect = {"fc_q.weight": (dim_q, D), "fc_k.weight": (dim_k, D), "fc_v.weight": (dim_k, D),
              "fc_o.weight": (D, D)}
    for short, shp in expect.items():
        if out[short].shape != shp:
            raise ValueError(f"{prefix}{short} must have shape {shp} ((in, out) = PyTorch weight.T); "
                             f"got {out[short].shape}")
    for short in out:
        if not (short.startswith("fc_") and short.endswith(".weight")) and out[short].shape != (D,):
            raise ValueError(f"{prefix}{short} must have shape ({D},); got {out[short].shape}")
    return out


def mab_forward(x: np.ndarray, y: np.ndarray, p: dict, *, num_heads: int, ln: bool, scale_dim: str):
    r"""One MAB on validated arrays ``x (B, nq, dQ)``, ``y (B, nk, dK)`` and a prefix-free param
    dict (see the module docstring). Returns ``(out, cache)``."""
    D = p["fc_q.weight"].shape[1]
    H = num_heads
    dh = D // H
    Q = linear_apply(x, p["fc_q.weight"], p["fc_q.bias"])
    K = linear_apply(y, p["fc_k.weight"], p["fc_k.bias"])
    V = linear_apply(y, p["fc_v.weight"], p["fc_v.bias"])
    Qh, Kh, Vh = split_heads(Q, H, dh), split_heads(K, H, dh), split_heads(V, H, dh)
    s = float(D if scale_dim == "full" else dh) ** -0.5  # a Python float keeps float32
    P, _ = softmax_lse(s * (Qh @ np.swapaxes(Kh, -1, -2)), axis=-1)
    O = merge_heads(Qh + P @ Vh)
    c0 = c1 = None
    O1 = O
    if ln:
        O1, c0 = layer_norm_forward(O, {"weight": p["ln0.weight"], "bias": p["ln0.bias"]})
    z = linear_apply(O1, p["fc_o.weight"], p["fc_o.bias"])
    O2 = O1 + np.maximum(z, 0.0)
    out = O2
    if ln:
        out, c1 = layer_norm_forward(O2, {"weight": p["ln1.weight"], "bias": p["ln1.bias"]})
    cache = {"x": x, "y": y, "p": p, "Qh": Qh, "Kh": Kh, "Vh": Vh, "P": P, "s": s, "O1": O1, "z": z,
             "c0": c0, "c1": c1, "H": H, "ln": ln}
    return out, cache


def mab_backward(g: np.ndarray, c: dict):
    """VJP of :func:`mab_forward`: ``(dx, dy, dparams)`` (prefix-free keys)."""
    p, H, ln = c["p"], c["H"], c["ln"]
    grads = {}
    if ln:
        lg = layer_norm_backward(g, c["c1"])
        g, grads["ln1.weight"], grads["ln1.bias"] = lg["x"], lg["weight"], lg["bias"]
    gr = g * (c["z"] > 0)
    lo = linear_vjp(gr, c["O1"], p["fc_o.weight"])
    grads["fc_o.weight"], grads["fc_o.bias"] = lo["weight"], lo["bias"]
    g1 = g + lo["x"]
    if ln:
        lg = layer_norm_backward(g1, c["c0"])
        g1, grads["ln0.weight"], grads["ln0.bias"] = lg["x"], lg["weight"], lg["bias"]
    gO = split_heads(g1, H)
    P, Qh, Kh, Vh, s = c["P"], c["Qh"], c["Kh"], c["Vh"], c["s"]
    dVh = np.swapaxes(P, -1, -2) @ gO
    dS = softmax_vjp(P, gO @ np.swapaxes(Vh, -1, -2), axis=-1)
    dQh = gO + s * (dS @ Kh)
    dKh = s * (np.swapaxes(dS, -1, -2) @ Qh)
    dQ, dK, dV = merge_heads(dQh), merge_heads(dKh), merge_heads(dVh)
    dx = None
    dy = 0.0
    for name, d, inp in (("fc_q", dQ, c["x"]), ("fc_k", dK, c["y"]), ("fc_v", dV, c["y"])):
        lv = linear_vjp(d, inp, p[f"{name}.weight"])
        grads[f"{name}.weight"], grads[f"{name}.bias"] = lv["weight"], lv["bias"]
        if name == "fc_q":
            dx = lv["x"]
        else:
            dy = dy + lv["x"]
    return dx, dy, grads


def set_transformer_forward(x, y=None, params=None, *, block: str = "sab", num_heads: int = 1,
                            ln: bool = False, scale_dim: str = "full"):
    r"""Set Transformer block on a batch of sets ``x (B, n, d_in)``.

    Parameters
    ----------
    x : (B, n, d_in)
        The set (for ``"mab"``: the query set $X$).
    y : (B, m, d_K), only for ``block="mab"``
        The key/value set $Y$ of $\mathrm{MAB}(X, Y)$.
    params : dict
        MAB parameters (module docstring); ``"isab"`` adds ``"I" (1, m, D)`` and prefixes
        ``"mab0."`` ($\mathrm{MAB}(I, X)$, ``dim_Q = D``) and ``"mab1."`` ($\mathrm{MAB}(X, H)$);
        ``"pma"`` adds ``"S" (1, k, D)`` (``d_in = D``) and prefix ``"mab."``.
    block : {"mab", "sab", "isab", "pma"}
        ``sab``: $\mathrm{MAB}(X, X)$; ``isab``: $\mathrm{MAB}(X, \mathrm{MAB}(I, X))$;
        ``pma``: $\mathrm{MAB}(S, X)$ (output ``(B, k, D)``).
    num_heads : int
        Must divide $D$.
    ln : bool
        Upstream ``ln`` (default False).
    scale_dim : {"full", "head"}
        $1/\sqrt{D}$ (upstream reference code) or $1/\sqrt{D/H}$ (standard MHA).

    Returns
    -------
    out : (B, n_out, D), cache

    The backward derivation is in the module docstring.
    """
    check_choice(block, "block", BLOCKS)
    check_choice(scale_dim, "scale_dim", ("full", "head"))
    H = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(ln, (bool, np.bool_)):
        raise TypeError(f"ln must be a bool; got {type(ln).__name__}")
    ln = bool(ln)
    x = as_float(x, "x", ndim=3)
    if block == "mab":
        y = as_float(y, "y", ndim=3)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have x's batch size {x.shape[0]}; got y of shape {y.shape}")
    elif y is not None:
        raise ValueError(f"y is only used by block='mab'; got y with block={block!r}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of the block's parameters; got {type(params).__name__}")
    arrays = [x] + ([y] if y is not None else []) + [np.asarray(a) for a in params.values()
                                                     if np.asarray(a).dtype.kind == "f"]
    dt = np.result_type(compute_dtype(*arrays), np.float32)  # float16 params compute in float32
    x = x.astype(dt, copy=False)
    B, n, din = x.shape
    if block == "isab":
        allowed = {"I"} | set(_mab_param_names(ln, "mab0.")) | set(_mab_param_names(ln, "mab1."))
    elif block == "pma":
        allowed = {"S"} | set(_mab_param_names(ln, "mab."))
    else:
        allowed = set(_mab_param_names(ln))
    extra = sorted(set(params) - allowed)
    if extra:
        raise ValueError(f"params has unknown keys {extra} for block={block!r}, ln={ln}")

    def D_of(prefix):
        w = as_float(params.get(f"{prefix}fc_q.weight"), f"{prefix}fc_q.weight", ndim=2)
        if w.shape[1] % H:
            raise ValueError(f"num_heads ({H}) must divide the width D = {prefix}fc_q.weight.shape[1] "
                             f"({w.shape[1]})")
        return w.shape[1]

    kw = {"num_heads": H, "ln": ln, "scale_dim": scale_dim}
    if block in ("mab", "sab"):
        D = D_of("")
        yy = x if block == "sab" else y.astype(dt, copy=False)
        p = _get_mab_params(params, "", din, yy.shape[2], ln, dt)
        out, c = mab_forward(x, yy, p, **kw)
        return out, {"block": block, "c": c, "shape": out.shape, "dt": dt}
    if block == "isab":
        D = D_of("mab0.")
        ind = as_float(params.get("I"), "I", ndim=3)
        if ind.shape[0] != 1 or ind.shape[2] != D:
            raise ValueError(f"I must have shape (1, num_inds, D={D}); got {ind.shape}")
        p0 = _get_mab_params(params, "mab0.", D, din, ln, dt)
        p1 = _get_mab_params(params, "mab1.", din, D, ln, dt)
        if p1["fc_q.weight"].shape[1] != D:
            raise ValueError(f"mab1.fc_q.weight must have shape ({din}, {D}); got {p1['fc_q.weight'].shape}")
        Ib = np.broadcast_to(ind.astype(dt, copy=False), (B,) + ind.shape[1:])
        h, c0 = mab_forward(Ib, x, p0, **kw)
        out, c1 = mab_forward(x, h, p1, **kw)
        return out, {"block": block, "c0": c0, "c1": c1, "shape": out.shape, "dt": dt}
    D = D_of("mab.")
    seeds = as_float(params.get("S"), "S", ndim=3)
    if seeds.shape[0] != 1 or seeds.shape[2] != D:
        raise ValueError(f"S must have shape (1, num_seeds, D={D}); got {seeds.shape}")
    p = _get_mab_params(params, "mab.", D, din, ln, dt)
    Sb = np.broadcast_to(seeds.astype(dt, copy=False), (B,) + seeds.shape[1:])
    out, c = mab_forward(Sb, x, p, **kw)
    return out, {"block": block, "c": c, "shape": out.shape, "dt": dt}


def set_transformer_backward(dout, cache):
    r"""Gradients of :func:`set_transformer_forward`: ``"x"`` (and ``"y"`` for MAB) plus every
    parameter key (``"I"``/``"S"`` summed over the batch). Derivation in the module docstring."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    block = cache["block"]
    if block in ("mab", "sab"):
        dx, dy, gp = mab_backward(g, cache["c"])
        grads = dict(gp)
        if block == "sab":
            grads["x"] = dx + dy
        else:
            grads["x"], grads["y"] = dx, dy
        return grads
    if block == "isab":
        dx1, dh, gp1 = mab_backward(g, cache["c1"])
        dI, dx0, gp0 = mab_backward(dh, cache["c0"])
        grads = {f"mab0.{k}": v for k, v in gp0.items()}
        grads.update({f"mab1.{k}": v for k, v in gp1.items()})
        grads["I"] = dI.sum(axis=0, keepdims=True)
        grads["x"] = dx0 + dx1
        return grads
    dS, dx, gp = mab_backward(g, cache["c"])
    grads = {f"mab.{k}": v for k, v in gp.items()}
    grads["S"] = dS.sum(axis=0, keepdims=True)
    grads["x"] = dx
    return grads


def set_transformer(x, y=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`set_transformer_forward`."""
    return set_transformer_forward(x, y, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _mab_params(rng, dim_q, dim_k, D, ln, prefix=""):
    p = {}
    for name, din in (("fc_q", dim_q), ("fc_k", dim_k), ("fc_v", dim_k), ("fc_o", D)):
        p[f"{prefix}{name}.weight"] = rng.standard_normal((din, D)) / np.sqrt(din)
        p[f"{prefix}{name}.bias"] = 0.2 * rng.standard_normal(D)
    if ln:
        for name in ("ln0", "ln1"):
            p[f"{prefix}{name}.weight"] = 1.0 + 0.2 * rng.standard_normal(D)
            p[f"{prefix}{name}.bias"] = 0.2 * rng.standard_normal(D)
    return p


def _min_relu_margin(s) -> float:
    """Smallest |pre-activation| of the rFF ReLUs at a sample (kink distance)."""
    _, c = set_transformer_forward(**s.inputs, params=s.params, **s.config)
    caches = [c[key] for key in ("c", "c0", "c1") if key in c]
    return min(float(np.min(np.abs(cc["z"]))) for cc in caches)


def _block_sample(rng, size, block, ln, scale_dim="full"):
    """A sample whose ReLU pre-activations are all at least 1e-3 from the kink (rejection), so
    finite differences (steps 1e-6 / 1e-5) never cross it."""
    for _ in range(200):
        s = _block_sample_raw(rng, size, block, ln, scale_dim)
        if _min_relu_margin(s) > 1e-3:
            return s
    raise RuntimeError("could not draw a Set Transformer sample away from the ReLU kink")


def _block_sample_raw(rng, size, block, ln, scale_dim="full"):
    tiny = size == "tiny"
    B = 2
    n = int(rng.integers(3, 5)) if tiny else int(rng.integers(6, 12))
    din = 3 if tiny else 5
    D = 4 if tiny else 8
    H = 2
    config = {"block": block, "num_heads": H, "ln": ln, "scale_dim": scale_dim}
    if block == "mab":
        m = int(rng.integers(2, 4)) if tiny else 7
        dk = 2 if tiny else 6
        return Sample(inputs={"x": rng.standard_normal((B, n, din)), "y": rng.standard_normal((B, m, dk))},
                      params=_mab_params(rng, din, dk, D, ln), config=config)
    if block == "sab":
        return Sample(inputs={"x": rng.standard_normal((B, n, din))}, params=_mab_params(rng, din, din, D, ln),
                      config=config)
    if block == "isab":
        m = 2 if tiny else 4
        params = {"I": rng.standard_normal((1, m, D)) * 0.5}
        params.update(_mab_params(rng, D, din, D, ln, "mab0."))
        params.update(_mab_params(rng, din, D, D, ln, "mab1."))
        return Sample(inputs={"x": rng.standard_normal((B, n, din))}, params=params, config=config)
    k = 2 if tiny else 3
    params = {"S": rng.standard_normal((1, k, D)) * 0.5}
    params.update(_mab_params(rng, D, D, D, ln, "mab."))
    return Sample(inputs={"x": rng.standard_normal((B, n, D))}, params=params, config=config)


def _sample(rng, size, block=None, ln=None, scale_dim="full"):
    """The record's sampler: a random block and ``ln`` unless given (tests pass them to get one
    block), every ReLU pre-activation at least 1e-3 from the kink (`_block_sample`)."""
    if block is None:
        block = BLOCKS[int(rng.integers(0, len(BLOCKS)))]
    if ln is None:
        ln = bool(rng.integers(0, 2))
    return _block_sample(rng, size, block, ln, scale_dim)


def _check_fd_every_block(rng):
    from ...testing import gradcheck

    errs = []
    for block in BLOCKS:
        for ln, sd in ((False, "full"), (True, "head")):
            s = _block_sample(rng, "tiny", block, ln, sd)
            if block == "isab" and ln:
                s.inputs["x"] = s.inputs["x"][:, :3]
            errs.append(gradcheck(set_transformer_forward, set_transformer_backward, s).max_rel)
    return max(errs)


def _check_permutation(rng):
    """SAB/ISAB are permutation-equivariant and PMA invariant, in outputs and input gradients."""
    err = 0.0
    for block in ("sab", "isab", "pma"):
        s = _block_sample(rng, "small", block, ln=True)
        x = s.inputs["x"]
        perm = rng.permutation(x.shape[1])
        o, c = set_transformer_forward(x, None, s.params, **s.config)
        op, cp = set_transformer_forward(x[:, perm], None, s.params, **s.config)
        g = rng.standard_normal(o.shape)
        if block == "pma":
            e_out = np.abs(op - o).max()
            gp = g
        else:
            e_out = np.abs(op - o[:, perm]).max()
            gp = g[:, perm]
        d, dp = set_transformer_backward(g, c), set_transformer_backward(gp, cp)
        e_grad = np.abs(dp["x"] - d["x"][:, perm]).max()
        e_par = max(np.abs(dp[kk] - d[kk]).max() for kk in d if kk != "x")
        err = max(err, float(e_out), float(e_grad), float(e_par))
    assert err < 1e-12, f"permutation symmetry violated: {err}"
    return err


def _check_isab_two_hops(rng):
    """ISAB is exactly MAB(X, MAB(I, X)) (two attention hops) — composed from the public MAB."""
    s = _block_sample(rng, "small", "isab", ln=False)
    x, p = s.inputs["x"], s.params
    kw = {"num_heads": 2, "ln": False, "scale_dim": "full", "block": "mab"}
    p0 = {k[5:]: v for k, v in p.items() if k.startswith("mab0.")}
    p1 = {k[5:]: v for k, v in p.items() if k.startswith("mab1.")}
    h = set_transformer(np.repeat(p["I"], x.shape[0], axis=0), x, p0, **kw)
    ref = set_transformer(x, h, p1, **kw)
    err = float(np.abs(set_transformer(x, None, p, **s.config) - ref).max())
    assert err < 1e-13, err
    return err


register(
    Mechanism(
        slug="set_transformer_blocks", family="4-linear-kernel-sparse", tier="T1",
        title="Set Transformer MAB / SAB / ISAB / PMA (reference-code semantics, explicit scale)",
        paper="Lee, Lee, Kim, Kosiorek, Choi, Teh, 'Set Transformer: A Framework for Attention-based "
              "Permutation-Invariant Neural Networks', ICML 2019, arXiv 1810.00825",
        forward=set_transformer_forward, backward=set_transformer_backward, sample=_sample,
        checks={"gradcheck_every_block": _check_fd_every_block,
                "permutation_equivariance_invariance": _check_permutation,
                "isab_is_two_mab_hops": _check_isab_two_hops},
        docs="linear-attention.md#set-transformer",
    ),
)
