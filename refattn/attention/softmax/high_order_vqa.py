r"""High-order attention for three modalities (question, image, answers): unary, pairwise and
ternary potentials merged per modality, then one softmax attention per modality.

Paper: Schwartz, Schwing, Hazan, "High-Order Attention Models for Visual Question Answering",
NeurIPS 2017, arXiv 1711.04323. Upstream (Lua Torch, ``nngraph``): idansc/HighOrderAtten
``misc/attention.lua`` @e626f60ce6fc407b4d25f890d16b4d766e0e409b (``Un``, ``Pw``, ``Tr``,
``corrMatrix3``, ``attend``, ``module_step``, ``margin_attention``) and ``misc/maskSoftmax.lua``;
``misc/vqa_model.lua`` builds it with ``margin_attention(seq_length, 196, 18, hidden_size)``.
This module follows the released code, which fixes what the paper's description leaves open
(the catalogue's ReLU unary and normalised pairwise forms are not what the code computes).

Forward
-------
Question $Q\in\mathbb R^{n_1\times E}$, image $V\in\mathbb R^{n_2\times E}$, answers $A\in\mathbb R^{n_3\times E}$
(one embedding width $E$; the sequence lengths are part of the layer: some weights are indexed by
position). With $\mathrm{emb}(X) = XW + b$ (a separate ``Linear(E, E)`` in every use):

* unary (``Un``): $u_X = \tanh(\mathrm{emb}(X))\,w + \beta\in\mathbb R^{n_X}$ (dropout 0.5 before $w$
  upstream; inference mode here);
* pairwise (``Pw``) for $(X, Y)\in\{(Q,V), (Q,A), (V,A)\}$: $S = C\odot\big(\mathrm{emb}(X)\,\mathrm{emb}(Y)^\top\big)$
  with a learned elementwise weight $C\in\mathbb R^{n_X\times n_Y}$ (``nn.CMul``), and
  $p_{X\leftarrow Y} = \tanh(Sw_Y + \beta)\in\mathbb R^{n_X}$, $p_{Y\leftarrow X} = \tanh(S^\top w_X + \beta')\in\mathbb R^{n_Y}$;
* ternary (``Tr``): $T_{ijk} = C_{ijk}\sum_c\mathrm{emb}(Q)_{ic}\,\mathrm{emb}(V)_{jc}\,\mathrm{emb}(A)_{kc}$ and
  $t_Q = \tanh\big(\sum_{jk}T_{ijk}w^{(Q)}_{kj} + \beta\big)$, $t_V = \tanh\big(\sum_{ik}T_{ijk}w^{(V)}_{ki} + \beta\big)$,
  $t_A = \tanh\big(\sum_{ij}T_{ijk}w^{(A)}_{ji} + \beta\big)$;
* merge: $\theta_Q = m_Q^\top[u_Q;\,p_{Q\leftarrow V};\,p_{Q\leftarrow A};\,t_Q] + \beta$ (``Linear(4, 1)`` per
  position), likewise $\theta_V$ from $[u_V; p_{V\leftarrow Q}; p_{V\leftarrow A}; t_V]$ and $\theta_A$ from
  $[u_A; p_{A\leftarrow Q}; p_{A\leftarrow V}; t_A]$;
* attend: $\hat X = \mathrm{softmax}(\theta_X)^\top X$ (the *unembedded* features); the question softmax is
  masked (``maskSoftMax``: padded words set to $-9999999$, ``mask_value``).

Output ``(B, 3, E)``: $[\hat Q; \hat V; \hat A]$ (upstream returns the three as a table).

Parameter names are refattn's (nngraph nodes are unnamed), one prefix per upstream call:
``unary_{q,v,a}.{embed,score}.*``, ``pair_{qv,qa,va}.{embed_x,embed_y,cmul,score_x,score_y}.*``
(``score_x`` gives $p_{X\leftarrow Y}$, so its weight is $(n_Y, 1)$), ``triple.{embed_q,embed_v,embed_a,cmul,
score_q,score_v,score_a}.*``, ``merge_{q,v,a}.*``; linear weights ``(in, out)`` (Torch's ``weight.T``).
Two storage details follow upstream exactly: ``triple.cmul`` has Torch's shape $(n_1, n_2, n_3)$ but
multiplies the correlation tensor in *its* memory order $(n_2, n_3, n_1)$ (``nn.CMul`` on a batch flattens
both), i.e. $C_{ijk}$ = ``cmul.reshape(n2, n3, n1)[j, k, i]``; and the ternary score weights read the
flattened ``Transpose`` views, $w^{(Q)}$ = ``score_q.weight.reshape(n3, n2)``, $w^{(V)}$ =
``score_v.weight.reshape(n3, n1)``, $w^{(A)}$ = ``score_a.weight.reshape(n2, n1)``.

Backward
--------
Softmax VJP per modality ($d\theta = \pi\odot(d\pi - \sum\pi\,d\pi)$ with $d\pi = X\,d\hat X$), the merge
layers, $\tanh' = 1 - \tanh^2$ of each potential; pairwise: $dS = d\mathrm{pre}_X w_Y^\top + w_X\,d\mathrm{pre}_Y^\top$,
$dC = \sum_b dS\odot(\mathrm{emb}X\,\mathrm{emb}Y^\top)$, $d\,\mathrm{emb}X = (dS\odot C)\,\mathrm{emb}Y$, and
symmetrically; ternary: $dT$ collects the three score terms, $dC = \sum_b dT\odot T/C$ (computed from
the unweighted correlation), and $d\,\mathrm{emb}Q_{ic} = \sum_{jk}(dT\odot C)_{ijk}\,\mathrm{emb}V_{jc}\,\mathrm{emb}A_{kc}$ (and
cyclically); then every embedding's linear VJP. The features receive their embedding gradients plus
the attention-sum gradient $\pi\,d\hat X^\top$.

Agreement with upstream (measured)
---------------------------------
HighOrderAtten is Lua Torch (``nngraph``) and does not run here: ``margin_attention`` was
transcribed into a float64 torch scratch script following its tensor layouts literally
(``corrMatrix3``'s loop, ``nn.CMul`` on the flattened rows, ``nn.Transpose``/``nn.View``) and compared
with `hoa_vqa_forward`/`hoa_vqa_backward`, output and all 62 gradient arrays: worst abs
$1.8\cdot10^{-15}$ / rel $1.1\cdot10^{-13}$.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, compute_dtype
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = [
    "HOA_VQA_MODALITIES",
    "hoa_vqa_param_spec",
    "init_hoa_vqa_params",
    "hoa_vqa_forward",
    "hoa_vqa_backward",
    "hoa_vqa",
]

HOA_VQA_MODALITIES = ("q", "v", "a")
_PAIRS = (("q", "v"), ("q", "a"), ("v", "a"))
_MERGE = {"q": (("pair_qv", "x"), ("pair_qa", "x")), "v": (("pair_qv", "y"), ("pair_va", "x")),
          "a": (("pair_qa", "y"), ("pair_va", "y"))}
MASK_FILL = -9999999.0


def hoa_vqa_param_spec(n_q: int, n_v: int, n_a: int, dim: int) -> dict:
    """``check_params`` spec (refattn names, see the module docstring)."""
    n = {"q": n_q, "v": n_v, "a": n_a}
    e = dim
    spec = {}
    for m in HOA_VQA_MODALITIES:
        spec.update({f"unary_{m}.embed.weight": (e, e), f"unary_{m}.embed.bias": (e,),
                     f"unary_{m}.score.weight": (e, 1), f"unary_{m}.score.bias": (1,)})
    for x, y in _PAIRS:
        pre = f"pair_{x}{y}"
        spec.update({f"{pre}.embed_x.weight": (e, e), f"{pre}.embed_x.bias": (e,), f"{pre}.embed_y.weight": (e, e),
                     f"{pre}.embed_y.bias": (e,), f"{pre}.cmul": (n[x], n[y]), f"{pre}.score_x.weight": (n[y], 1),
                     f"{pre}.score_x.bias": (1,), f"{pre}.score_y.weight": (n[x], 1), f"{pre}.score_y.bias": (1,)})
    for m in HOA_VQA_MODALITIES:
        spec.update({f"triple.embed_{m}.weight": (e, e), f"triple.embed_{m}.bias": (e,)})
    spec["triple.cmul"] = (n_q, n_v, n_a)
    spec.update({"triple.score_q.weight": (n_v * n_a, 1), "triple.score_q.bias": (1,),
                 "triple.score_v.weight": (n_q * n_a, 1), "triple.score_v.bias": (1,),
                 "triple.score_a.weight": (n_q * n_v, 1), "triple.score_a.bias": (1,)})
    for m in HOA_VQA_MODALITIES:
        spec.update({f"merge_{m}.weight": (4, 1), f"merge_{m}.bias": (1,)})
    return spec


def init_hoa_vqa_params(rng, n_q: int, n_v: int, n_a: int, dim: int, *, scale: float = 1.0) -> dict:
    """Random parameters in spec order (normal, std ``scale / sqrt(fan_in)``; CMul weights around 1)."""
    out = {}
    for k, s in hoa_vqa_param_spec(n_q, n_v, n_a, dim).items():
        if k.endswith("cmul"):
            out[k] = 1.0 + 0.3 * rng.standard_normal(s)
        elif len(s) == 2:
            out[k] = (scale / np.sqrt(s[0])) * rng.standard_normal(s)
        else:
            out[k] = 0.1 * rng.standard_normal(s)
    return out


def _emb(p, pre, x):
    return x @ p[f"{pre}.weight"] + p[f"{pre}.bias"]


def _emb_vjp(grads, p, pre, dy, x):
    grads[f"{pre}.weight"] = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
    grads[f"{pre}.bias"] = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    return dy @ p[f"{pre}.weight"].T


def hoa_vqa_forward(ques, img, ans, params, *, ques_mask=None, mask_value: float = MASK_FILL):
    r"""Three-modality high-order attention (upstream ``margin_attention``; module docstring).

    Parameters
    ----------
    ques : array (B, n_q, E)
    img : array (B, n_v, E)
    ans : array (B, n_a, E)
    params : dict
        ``hoa_vqa_param_spec(n_q, n_v, n_a, E)`` keys.
    ques_mask : bool array (B, n_q), optional
        True = real word (upstream's byte mask is the negation: 1 = padding).
    mask_value : float
        The potential of a padded word (upstream $-9999999$).

    Returns
    -------
    out, cache
        ``(B, 3, E)``: the attended question, image and answer vectors.
    """
    feats = {"q": as_float(ques, "ques", ndim=3), "v": as_float(img, "img", ndim=3), "a": as_float(ans, "ans", ndim=3)}
    b, _, e = feats["q"].shape
    for m, name in (("v", "img"), ("a", "ans")):
        if feats[m].shape[0] != b or feats[m].shape[2] != e:
            raise ValueError(f"{name} must have shape (B, n, E) with ques' B={b} and E={e}; got {feats[m].shape}")
    n = {m: feats[m].shape[1] for m in HOA_VQA_MODALITIES}
    if ques_mask is not None:
        ques_mask = np.asarray(ques_mask)
        if ques_mask.dtype != np.bool_:
            raise TypeError(f"ques_mask must be a boolean array (True = word); got dtype {ques_mask.dtype}")
        if ques_mask.shape != (b, n["q"]):
            raise ValueError(f"ques_mask must have shape (B, n_q) = {(b, n['q'])}; got {ques_mask.shape}")
    mask_value = float(mask_value)
    p = check_params(params, hoa_vqa_param_spec(n["q"], n["v"], n["a"], e), where="hoa_vqa (HighOrderAtten)")
    dt = compute_dtype(*feats.values(), *p.values())
    feats, p = {m: f.astype(dt, copy=False) for m, f in feats.items()}, cast_all(dt, p)
    c = {"feats": feats, "p": p, "n": n}
    pot = {}
    for m in HOA_VQA_MODALITIES:                                               # unary
        hu = np.tanh(_emb(p, f"unary_{m}.embed", feats[m]))
        c[f"un_{m}"] = hu
        pot[f"u_{m}"] = hu @ p[f"unary_{m}.score.weight"][:, 0] + p[f"unary_{m}.score.bias"][0]
    for x, y in _PAIRS:                                                        # pairwise
        pre = f"pair_{x}{y}"
        ex, ey = _emb(p, f"{pre}.embed_x", feats[x]), _emb(p, f"{pre}.embed_y", feats[y])
        raw = ex @ np.swapaxes(ey, -1, -2)
        s = raw * p[f"{pre}.cmul"]
        tx = np.tanh(s @ p[f"{pre}.score_x.weight"][:, 0] + p[f"{pre}.score_x.bias"][0])
        ty = np.tanh(np.swapaxes(s, -1, -2) @ p[f"{pre}.score_y.weight"][:, 0] + p[f"{pre}.score_y.bias"][0])
        c[pre] = {"ex": ex, "ey": ey, "raw": raw, "s": s, "tx": tx, "ty": ty}
        pot[f"{pre}.x"], pot[f"{pre}.y"] = tx, ty
    eq, ev, ea = (_emb(p, f"triple.embed_{m}", feats[m]) for m in HOA_VQA_MODALITIES)   # ternary
    raw = np.einsum("bic,bjc,bkc->bijk", eq, ev, ea)
    cw = np.transpose(p["triple.cmul"].reshape(n["v"], n["a"], n["q"]), (2, 0, 1))
    t = raw * cw
    wq = p["triple.score_q.weight"][:, 0].reshape(n["a"], n["v"])
    wv = p["triple.score_v.weight"][:, 0].reshape(n["a"], n["q"])
    wa = p["triple.score_a.weight"][:, 0].reshape(n["v"], n["q"])
    tt = {"q": np.tanh(np.einsum("bijk,kj->bi", t, wq) + p["triple.score_q.bias"][0]),
          "v": np.tanh(np.einsum("bijk,ki->bj", t, wv) + p["triple.score_v.bias"][0]),
          "a": np.tanh(np.einsum("bijk,ji->bk", t, wa) + p["triple.score_a.bias"][0])}
    c["tri"] = {"e": (eq, ev, ea), "raw": raw, "cw": cw, "t": t, "w": (wq, wv, wa), "tt": tt}
    outs = []
    for m in HOA_VQA_MODALITIES:                                               # merge and attend
        stack = np.stack([pot[f"u_{m}"]] + [pot[f"{pr}.{side}"] for pr, side in _MERGE[m]] + [tt[m]], axis=-1)
        theta = stack @ p[f"merge_{m}.weight"][:, 0] + p[f"merge_{m}.bias"][0]
        if m == "q" and ques_mask is not None:
            theta = np.where(ques_mask, theta, mask_value)
        pi, _ = softmax_lse(theta, axis=-1)
        c[f"stack_{m}"], c[f"pi_{m}"] = stack, pi
        outs.append(np.einsum("bn,bne->be", pi, feats[m]))
    c["qmask"] = ques_mask
    out = np.stack(outs, axis=1)
    c["shape"] = out.shape
    return out, c


def hoa_vqa_backward(dout, cache):
    """Gradient of :func:`hoa_vqa_forward`: ``ques``, ``img``, ``ans`` and every parameter."""
    feats, p, n = cache["feats"], cache["p"], cache["n"]
    g = as_dout(dout, cache["shape"], feats["q"].dtype)
    grads = {}
    dfeat = {m: np.zeros_like(f) for m, f in feats.items()}
    dpot = {}
    for idx, m in enumerate(HOA_VQA_MODALITIES):
        pi, gm = cache[f"pi_{m}"], g[:, idx]
        dfeat[m] += pi[..., None] * gm[:, None, :]
        dth = softmax_vjp(pi, np.einsum("bne,be->bn", feats[m], gm))
        if m == "q" and cache["qmask"] is not None:
            dth = np.where(cache["qmask"], dth, 0.0)
        stack = cache[f"stack_{m}"]
        grads[f"merge_{m}.weight"] = np.einsum("bn,bnf->f", dth, stack)[:, None]
        grads[f"merge_{m}.bias"] = np.reshape(dth.sum(), (1,))
        dst = dth[..., None] * p[f"merge_{m}.weight"][:, 0]
        dpot[f"u_{m}"] = dst[..., 0]
        for f, (pr, side) in enumerate(_MERGE[m], start=1):
            dpot[f"{pr}.{side}"] = dst[..., f]
        dpot[f"t_{m}"] = dst[..., 3]
    for m in HOA_VQA_MODALITIES:                                               # unary
        hu = cache[f"un_{m}"]
        du = dpot[f"u_{m}"]
        grads[f"unary_{m}.score.weight"] = np.einsum("bn,bne->e", du, hu)[:, None]
        grads[f"unary_{m}.score.bias"] = np.reshape(du.sum(), (1,))
        dpre = du[..., None] * p[f"unary_{m}.score.weight"][:, 0] * (1.0 - hu * hu)
        dfeat[m] += _emb_vjp(grads, p, f"unary_{m}.embed", dpre, feats[m])
    for x, y in _PAIRS:                                                        # pairwise
        pre = f"pair_{x}{y}"
        cc = cache[pre]
        dpx = dpot[f"{pre}.x"] * (1.0 - cc["tx"] ** 2)
        dpy = dpot[f"{pre}.y"] * (1.0 - cc["ty"] ** 2)
        grads[f"{pre}.score_x.weight"] = np.einsum("bi,bij->j", dpx, cc["s"])[:, None]
        grads[f"{pre}.score_x.bias"] = np.reshape(dpx.sum(), (1,))
        grads[f"{pre}.score_y.weight"] = np.einsum("bj,bij->i", dpy, cc["s"])[:, None]
        grads[f"{pre}.score_y.bias"] = np.reshape(dpy.sum(), (1,))
        ds = dpx[:, :, None] * p[f"{pre}.score_x.weight"][:, 0] + p[f"{pre}.score_y.weight"][:, 0][:, None] * dpy[:, None, :]
        grads[f"{pre}.cmul"] = np.sum(ds * cc["raw"], axis=0)
        draw = ds * p[f"{pre}.cmul"]
        dfeat[x] += _emb_vjp(grads, p, f"{pre}.embed_x", draw @ cc["ey"], feats[x])
        dfeat[y] += _emb_vjp(grads, p, f"{pre}.embed_y", np.swapaxes(draw, -1, -2) @ cc["ex"], feats[y])
    tri = cache["tri"]                                                         # ternary
    (eq, ev, ea), (wq, wv, wa), tt, t = tri["e"], tri["w"], tri["tt"], tri["t"]
    dq_, dv_, da_ = (dpot[f"t_{m}"] * (1.0 - tt[m] ** 2) for m in HOA_VQA_MODALITIES)
    grads["triple.score_q.weight"] = np.einsum("bi,bijk->kj", dq_, t).reshape(-1, 1)
    grads["triple.score_v.weight"] = np.einsum("bj,bijk->ki", dv_, t).reshape(-1, 1)
    grads["triple.score_a.weight"] = np.einsum("bk,bijk->ji", da_, t).reshape(-1, 1)
    for m, d in zip(HOA_VQA_MODALITIES, (dq_, dv_, da_)):
        grads[f"triple.score_{m}.bias"] = np.reshape(d.sum(), (1,))
    dt_ = (dq_[:, :, None, None] * wq.T[None, None, :, :] + dv_[:, None, :, None] * wv.T[None, :, None, :]
           + da_[:, None, None, :] * wa.T[None, :, :, None])
    dcw = np.sum(dt_ * tri["raw"], axis=0)                                     # logical (n_q, n_v, n_a)
    grads["triple.cmul"] = np.transpose(dcw, (1, 2, 0)).reshape(n["q"], n["v"], n["a"])
    draw = dt_ * tri["cw"]
    for m, de in zip(HOA_VQA_MODALITIES, (np.einsum("bijk,bjc,bkc->bic", draw, ev, ea),
                                          np.einsum("bijk,bic,bkc->bjc", draw, eq, ea),
                                          np.einsum("bijk,bic,bjc->bkc", draw, eq, ev))):
        dfeat[m] += _emb_vjp(grads, p, f"triple.embed_{m}", de, feats[m])
    return {"ques": dfeat["q"], "img": dfeat["v"], "ans": dfeat["a"], **{k: grads[k] for k in p}}


def hoa_vqa(ques, img, ans, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`hoa_vqa_forward`."""
    return hoa_vqa_forward(ques, img, ans, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    nq, nv, na, e = (2, 2, 2, 2) if size == "tiny" else (int(rng.integers(3, 6)), 4, 3, 4)
    p = init_hoa_vqa_params(rng, nq, nv, na, e, scale=1.2)
    cfg = {}
    if size == "small" and rng.random() < 0.5:
        cfg["ques_mask"] = np.arange(nq)[None, :] < np.array([nq, nq - 1])[:, None]
    return Sample(inputs={"ques": rng.standard_normal((2, nq, e)), "img": rng.standard_normal((2, nv, e)),
                          "ans": rng.standard_normal((2, na, e))}, params=p, config=cfg)


def _reference(ques, img, ans, params, *, ques_mask=None, mask_value=MASK_FILL):
    # Upstream's tensor layouts, element by element: the correlation in memory order (n_v, n_a, n_q)
    # times the flat CMul weight, and the flattened views read by the three score layers.
    p = params
    out = []
    for bb in range(ques.shape[0]):
        f = {"q": ques[bb], "v": img[bb], "a": ans[bb]}
        n = {m: f[m].shape[0] for m in f}
        pot = {}
        for m in HOA_VQA_MODALITIES:
            pot[m] = [np.tanh(f[m][i] @ p[f"unary_{m}.embed.weight"] + p[f"unary_{m}.embed.bias"])
                      @ p[f"unary_{m}.score.weight"][:, 0] + p[f"unary_{m}.score.bias"][0] for i in range(n[m])]
        pw = {}
        for x, y in _PAIRS:
            pre = f"pair_{x}{y}"
            ex = f[x] @ p[f"{pre}.embed_x.weight"] + p[f"{pre}.embed_x.bias"]
            ey = f[y] @ p[f"{pre}.embed_y.weight"] + p[f"{pre}.embed_y.bias"]
            s = np.array([[p[f"{pre}.cmul"][i, j] * (ex[i] @ ey[j]) for j in range(n[y])] for i in range(n[x])])
            pw[f"{pre}.x"] = [np.tanh(s[i] @ p[f"{pre}.score_x.weight"][:, 0] + p[f"{pre}.score_x.bias"][0])
                              for i in range(n[x])]
            pw[f"{pre}.y"] = [np.tanh(s[:, j] @ p[f"{pre}.score_y.weight"][:, 0] + p[f"{pre}.score_y.bias"][0])
                              for j in range(n[y])]
        e3 = {m: f[m] @ p[f"triple.embed_{m}.weight"] + p[f"triple.embed_{m}.bias"] for m in f}
        nq, nv, na = n["q"], n["v"], n["a"]
        mem = np.zeros((nv, na, nq))
        flat = p["triple.cmul"].reshape(-1)
        for j in range(nv):
            for k in range(na):
                for i in range(nq):
                    mem[j, k, i] = flat[(j * na + k) * nq + i] * np.sum(e3["q"][i] * e3["v"][j] * e3["a"][k])
        tq = [np.tanh(np.transpose(mem, (2, 1, 0))[i].reshape(-1) @ p["triple.score_q.weight"][:, 0]
                      + p["triple.score_q.bias"][0]) for i in range(nq)]
        tv = [np.tanh(mem[j].reshape(-1) @ p["triple.score_v.weight"][:, 0] + p["triple.score_v.bias"][0])
              for j in range(nv)]
        ta = [np.tanh(np.transpose(mem, (1, 0, 2))[k].reshape(-1) @ p["triple.score_a.weight"][:, 0]
                      + p["triple.score_a.bias"][0]) for k in range(na)]
        tri = {"q": tq, "v": tv, "a": ta}
        res = []
        for m in HOA_VQA_MODALITIES:
            th = np.array([np.array([pot[m][i]] + [pw[f"{pr}.{sd}"][i] for pr, sd in _MERGE[m]] + [tri[m][i]])
                           @ p[f"merge_{m}.weight"][:, 0] + p[f"merge_{m}.bias"][0] for i in range(n[m])])
            if m == "q" and ques_mask is not None:
                th = np.where(ques_mask[bb], th, mask_value)
            w = np.exp(th - th.max())
            res.append((w / w.sum()) @ f[m])
        out.append(np.stack(res))
    return np.stack(out)


def _check_only_unary_is_three_independent_attentions(rng):
    # With the pairwise and ternary merge weights zero every modality attends with its own unary
    # potential: softmax(u_X) X.
    s = _sample(rng, "small")
    p = dict(s.params)
    for m in HOA_VQA_MODALITIES:
        p[f"merge_{m}.weight"] = np.array([[0.7], [0.0], [0.0], [0.0]])
    out = hoa_vqa(**s.inputs, params=p)
    err = 0.0
    for idx, (m, name) in enumerate(zip(HOA_VQA_MODALITIES, ("ques", "img", "ans"))):
        x = s.inputs[name]
        u = 0.7 * (np.tanh(x @ p[f"unary_{m}.embed.weight"] + p[f"unary_{m}.embed.bias"]) @ p[f"unary_{m}.score.weight"])[..., 0]
        w = np.exp(u - u.max(-1, keepdims=True))
        err = max(err, float(np.abs(out[:, idx] - np.einsum("bn,bne->be", w / w.sum(-1, keepdims=True), x)).max()))
    assert err < 1e-12, err
    return err


def _check_padded_question_words_get_no_attention(rng):
    # A padded word gets weight 0 and the attended question does not depend on its features (the
    # other modalities' potentials still read it, as upstream: only the question softmax is masked).
    s = _sample(rng, "small")
    keep = np.ones((2, s.inputs["ques"].shape[1]), bool)
    keep[1, -1] = False
    out1, c = hoa_vqa_forward(**s.inputs, params=s.params, ques_mask=keep)
    moved = dict(s.inputs, ques=s.inputs["ques"].copy())
    moved["ques"][1, -1] += 5.0
    out2 = hoa_vqa(**moved, params=s.params, ques_mask=keep)
    err = max(float(c["pi_q"][1, -1]), float(np.abs(out1[:, 0] - out2[:, 0]).max()))
    assert err == 0.0, f"a padded question word still receives attention ({err:.2e})"
    assert np.abs(out1[1, 1] - out2[1, 1]).max() > 0.0, "the image attention should still see the padded word"
    return err


register(
    Mechanism(
        slug="high_order_attention_vqa", family="1-softmax", tier="T3",
        title="High-order attention (unary, pairwise, ternary potentials) over question, image and answers",
        paper="Schwartz, Schwing, Hazan, High-Order Attention Models for Visual Question Answering, NeurIPS 2017, "
              "arXiv 1711.04323",
        forward=hoa_vqa_forward, backward=hoa_vqa_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#high-order-attention-for-vqa",
        checks={"only_unary_is_three_independent_attentions": _check_only_unary_is_three_independent_attentions,
                "padded_question_words_get_no_attention": _check_padded_question_words_get_no_attention},
    ),
)
