r"""CRATE white-box transformer block: MSSA (tied query = key = value) followed by one ISTA step.

One CRATE layer maps tokens $Z\in\mathbb R^{N\times C}$ to $Z^{+}$ in two half-steps. **MSSA**
(multi-head subspace self-attention, the compression step) projects the layer-normed tokens with
ONE matrix per head, $W_k = \mathrm{LN}_a(Z)\,U_k\in\mathbb R^{N\times p}$, and uses it as query,
key and value:

$$S_k = s\,W_kW_k^\top,\quad A_k = \mathrm{softmax}_{\text{row}}(S_k),\quad H_k = A_kW_k,\qquad
Z^{1/2} = Z + [H_1\|\dots\|H_K]\,U_{out} + b_{out},$$

$s = p^{-1/2}$. $S_k$ is symmetric, $A_k$ is not (row normalisation). The paper writes
$U_{out} = \frac{p}{N\epsilon^2}[U_1\dots U_K]^\top$; the official code learns $U_{out}$ (a
``nn.Linear`` with bias, dropped, as upstream, when $K=1$ and $p=C$: leave ``to_out`` out of
``params``). **ISTA** (the sparsification step) takes $X = \mathrm{LN}_f(Z^{1/2})$ and one proximal
gradient step on $\lambda\|\cdot\|_1 + \frac12\|X - \cdot\,D^\top\|^2$ from $X$, non-negative:

$$Z^{+} = \mathrm{ReLU}\big(X + \eta\,(XD - XD^\top D) - \eta\lambda\big),$$

with the dictionary $D\in\mathbb R^{C\times C}$ (upstream ``FeedForward.weight``: ``F.linear(x, D)``
$= xD^\top$, so $XD^\top D$ is ``grad_1`` and $XD$ is ``grad_2``). There is no residual around the
ISTA step (upstream ``Transformer.forward``: ``x = ff(attn(x) + x)``).

Backward
--------
With $G = \partial L/\partial Z^{+}$: $dU = G\odot\mathbb 1[U>0]$ ($U$ the ReLU argument; the
sampler keeps $|U|$ away from 0). $U$ is linear in $X$ and $D$:

$$dX = dU + \eta\,dU\,(D^\top - D^\top D),\qquad
dD = \eta X^\top dU - \eta\,D\,(X^\top dU + dU^\top X)$$

(the last term from $M = D^\top D$, $dM = -\eta X^\top dU$, $dD = D(dM + dM^\top)$). Then the LN
backward gives $dZ^{1/2}$; the residual passes it to $dZ$ and to the MSSA output. Through $U_{out}$
(linear VJP) to $dH_k$; the attention VJP (`attention_core_backward`, called with $Q=K=V=W_k$)
returns three contributions to the one tied projection,

$$dW_k = \underbrace{s\,dS_kW_k}_{\text{query}} + \underbrace{s\,dS_k^\top W_k}_{\text{key}} +
\underbrace{A_k^\top dH_k}_{\text{value}},\qquad dS_k = A_k\odot(dA_k - \mathrm{rowsum}(dA_k\odot A_k)),$$

so $dU_k = \mathrm{LN}_a(Z)^\top dW_k$ and $d\,\mathrm{LN}_a(Z) = \sum_k dW_kU_k^\top$, then the LN
backward and the residual ($dZ \mathrel{+}= dZ^{1/2}$).

Conventions (keyword, default = upstream)
-----------------------------------------
``step_size`` $\eta$ = 0.1 (upstream ``CRATE(ista=0.1)``), ``lambd`` $\lambda$ = 0.1 (hard-coded
``self.lambd``), ``scale`` $s$ = $p^{-1/2}$ (``dim_head ** -0.5``), ``eps`` = 1e-5 (``nn.LayerNorm``).
Parameter names are upstream's inside one ``Transformer.layers[i]`` with ``layers.i.0.`` renamed
``attn.`` and ``layers.i.1.`` renamed ``ff.``: ``attn.norm.weight/bias``, ``attn.fn.qkv.weight``
($(C, Kp)$ = torch ``weight.T``, no bias), ``attn.fn.to_out.0.weight/bias`` ($(Kp, C)$ = ``weight.T``),
``ff.norm.weight/bias``, ``ff.fn.weight`` = $D$ in upstream's own orientation (a bare
``nn.Parameter``, not a ``Linear``: no transpose). Dropout is identity (evaluation).

Paper: Y. Yu, S. Buchanan, D. Pai, T. Chu, Z. Wu, S. Tong, B. D. Haeffele, Y. Ma, "White-Box
Transformers via Sparse Rate Reduction", NeurIPS 2023, arXiv 2306.01129 (journal version: "White-Box
Transformers via Sparse Rate Reduction: Compression Is All There Is?", JMLR 2024, arXiv 2311.13110).
Upstream: Ma-Lab-Berkeley/CRATE ``model/crate.py`` (``Attention``, ``FeedForward``, ``PreNorm``,
``Transformer``) @ 674408fa82475fe1f172aa8213e21d4ba608afc4.

Measured agreement (float64, CPU, torch 2.13, upstream ``Transformer(dim, depth=1, ...)`` run as-is,
einops replaced by two reshapes; scratch script, not committed): $(C,K,p,N) = (8,2,4,5)$,
$(8,1,8,5)$ (``to_out`` = Identity) and $(16,4,4,7)$, batch 3, perturbed weights: output max abs
error 6.7e-16; gradients of $Z$ and of every parameter max abs error 4.4e-15, max rel 1.2e-15.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_param_keys, check_params, check_positive, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.norms import layer_norm_backward, layer_norm_forward
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = ["crate_block_forward", "crate_block_backward", "crate_block", "init_crate_params"]

_REQUIRED = ("attn.fn.qkv.weight", "ff.fn.weight")
_OPTIONAL = ("attn.norm.weight", "attn.norm.bias", "attn.fn.to_out.0.weight", "attn.fn.to_out.0.bias",
             "ff.norm.weight", "ff.norm.bias")


def _validate(z, params, num_heads):
    check_param_keys(params, _REQUIRED, _OPTIONAL, where="crate_block (linear weights (in, out); PyTorch: weight.T)")
    c = z.shape[-1]
    wq = as_float(params["attn.fn.qkv.weight"], "attn.fn.qkv.weight", ndim=2)
    if wq.shape[0] != c or wq.shape[1] % num_heads:
        raise ValueError(f"attn.fn.qkv.weight must have shape (C={c}, heads*dim_head) with num_heads={num_heads} "
                         f"dividing its second axis; got {wq.shape}")
    e = wq.shape[1]
    spec = {"attn.norm.weight": (c,), "attn.norm.bias": (c,), "attn.fn.qkv.weight": (c, e),
            "attn.fn.to_out.0.weight": (e, c), "attn.fn.to_out.0.bias": (c,),
            "ff.norm.weight": (c,), "ff.norm.bias": (c,), "ff.fn.weight": (c, c)}
    p = check_params(params, spec, optional=_OPTIONAL, where="crate_block")
    if "attn.fn.to_out.0.weight" not in p:
        if "attn.fn.to_out.0.bias" in p:
            raise ValueError("attn.fn.to_out.0.bias given without attn.fn.to_out.0.weight")
        if e != c:
            raise ValueError(f"without attn.fn.to_out.0.weight (upstream's Identity, heads == 1 and dim_head == dim) "
                             f"the qkv width must equal C={c}; got {e}")
    return p, e // num_heads


def _ln(x, p, prefix, eps):
    aff = {k: p[prefix + k] for k in ("weight", "bias") if prefix + k in p}
    return layer_norm_forward(x, aff or None, eps=eps)


def crate_block_forward(z, params, *, num_heads: int, step_size: float = 0.1, lambd: float = 0.1, scale=None,
                        eps: float = 1e-5):
    r"""One CRATE layer: $Z^{1/2} = Z + \mathrm{MSSA}(\mathrm{LN}Z)$, $Z^+ = \mathrm{ISTA}(\mathrm{LN}Z^{1/2})$.

    Parameters
    ----------
    z : array (B.., N, C)
    params : dict
        ``"attn.fn.qkv.weight" (C, K p)`` (the tied projection, torch ``weight.T``), ``"ff.fn.weight"
        (C, C)`` (the dictionary $D$, upstream orientation), optional ``"attn.fn.to_out.0.weight" (Kp, C)``
        with ``"attn.fn.to_out.0.bias" (C,)`` (absent: identity, needs $Kp = C$) and the two LayerNorms'
        ``"attn.norm.weight/bias"``, ``"ff.norm.weight/bias"`` (absent: no affine).
    num_heads : int
        $K$.
    step_size, lambd : float >= 0
        ISTA step $\eta$ and sparsity $\lambda$ (upstream 0.1, 0.1).
    scale : float > 0, optional
        Score scale; default ``dim_head ** -0.5``.
    eps : float
        LayerNorm epsilon (1e-5).

    Returns
    -------
    out, cache
        ``out (B.., N, C)``.
    """
    z = as_float(z, "z", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    step_size = check_positive(step_size, "step_size", allow_zero=True)
    lambd = check_positive(lambd, "lambd", allow_zero=True)
    eps = check_positive(eps, "eps", allow_zero=True)
    if params is None:
        raise TypeError("params is required: a dict with attn.fn.qkv.weight and ff.fn.weight")
    p, d = _validate(z, params, h)
    dt = compute_dtype(z, *p.values())
    z, p = z.astype(dt, copy=False), cast_all(dt, p)
    y1, ln_a = _ln(z, p, "attn.norm.", eps)
    w = split_heads(y1 @ p["attn.fn.qkv.weight"], h, d)
    o, core = attention_core_forward(w, w, w, scale=scale)
    oc = merge_heads(o)
    mssa = linear_apply(oc, p["attn.fn.to_out.0.weight"], p.get("attn.fn.to_out.0.bias")) \
        if "attn.fn.to_out.0.weight" in p else oc
    zh = z + mssa
    x, ln_f = _ln(zh, p, "ff.norm.", eps)
    dmat = p["ff.fn.weight"]
    u = x + step_size * (x @ dmat - (x @ dmat.T) @ dmat) - step_size * lambd
    out = np.maximum(u, 0.0)
    cache = {"p": p, "y1": y1, "ln_a": ln_a, "core": core, "oc": oc, "ln_f": ln_f, "x": x, "u_pos": u > 0,
             "eta": step_size, "h": h, "d": d, "shape": out.shape}
    return out, cache


def crate_block_backward(dout, cache):
    r"""Gradient of :func:`crate_block_forward` for ``z`` and every params key (module docstring):
    ISTA mask and the two $D$ matmuls, LN, residual, output projection, then the tied projection's
    three attention paths $dW = s(dS + dS^\top)W + A^\top dH$."""
    p, x, eta = cache["p"], cache["x"], cache["eta"]
    g = as_dout(dout, cache["shape"], x.dtype)
    dmat = p["ff.fn.weight"]
    du = g * cache["u_pos"]
    grads = {}
    dx = du + eta * ((du @ dmat.T) - (du @ dmat.T) @ dmat)
    xtdu = x.reshape(-1, x.shape[-1]).T @ du.reshape(-1, du.shape[-1])
    grads["ff.fn.weight"] = eta * xtdu - eta * dmat @ (xtdu + xtdu.T)
    gf = layer_norm_backward(dx, cache["ln_f"])
    dzh = gf.pop("x")
    for k, v in gf.items():
        grads["ff.norm." + k] = v
    dz = dzh.copy()
    if "attn.fn.to_out.0.weight" in p:
        go = linear_vjp(dzh, cache["oc"], p["attn.fn.to_out.0.weight"], "attn.fn.to_out.0.bias" in p)
        grads["attn.fn.to_out.0.weight"] = go["weight"]
        if "attn.fn.to_out.0.bias" in p:
            grads["attn.fn.to_out.0.bias"] = go["bias"]
        doc = go["x"]
    else:
        doc = dzh
    gc = attention_core_backward(split_heads(doc, cache["h"], cache["d"]), cache["core"])
    dw = merge_heads(gc["q"] + gc["k"] + gc["v"])
    gq = linear_vjp(dw, cache["y1"], p["attn.fn.qkv.weight"], False)
    grads["attn.fn.qkv.weight"] = gq["weight"]
    ga = layer_norm_backward(gq["x"], cache["ln_a"])
    dz += ga.pop("x")
    for k, v in ga.items():
        grads["attn.norm." + k] = v
    grads["z"] = dz
    return grads


def crate_block(z, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`crate_block_forward`."""
    return crate_block_forward(z, params, **config)[0]


def init_crate_params(rng, c: int, num_heads: int, head_dim: int, *, to_out: bool = True, affine: bool = True) -> dict:
    """Random parameters (uniform fan-in weights, perturbed LN affines) for tests and demos."""
    e = num_heads * head_dim
    p = {"attn.fn.qkv.weight": rng.uniform(-1, 1, (c, e)) / np.sqrt(c),
         "ff.fn.weight": rng.uniform(-1, 1, (c, c)) * np.sqrt(3.0 / c)}
    if to_out:
        p["attn.fn.to_out.0.weight"] = rng.uniform(-1, 1, (e, c)) / np.sqrt(e)
        p["attn.fn.to_out.0.bias"] = 0.1 * rng.standard_normal(c)
    if affine:
        for pre in ("attn.norm.", "ff.norm."):
            p[pre + "weight"] = 1.0 + 0.2 * rng.standard_normal(c)
            p[pre + "bias"] = 0.1 * rng.standard_normal(c)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _away_from_kink(rng, z, params, cfg, margin=0.03, tries=50):
    # redraw the LN-f bias until no ReLU argument is within `margin` of 0 (FD must not cross the kink)
    for _ in range(tries):
        _, c = crate_block_forward(z, params, **cfg)
        x, dm, eta = c["x"], params["ff.fn.weight"], cfg.get("step_size", 0.1)
        u = x + eta * (x @ dm - (x @ dm.T) @ dm) - eta * cfg.get("lambd", 0.1)
        if np.abs(u).min() > margin:
            return params
        params = dict(params, **{"ff.norm.bias": 0.1 * rng.standard_normal(z.shape[-1])})
    return params


def _sample(rng, size):
    if size == "tiny":
        n, c, h, d = int(rng.integers(2, 4)), 4, 2, 2
    else:
        n, c, h, d = int(rng.integers(4, 8)), 8, 2, 4
    to_out = bool(rng.random() < 0.75)
    if not to_out:
        h, d = 1, c
        if size == "tiny":
            n = 2
    z = rng.standard_normal((2, n, c))
    cfg = {"num_heads": h}
    if rng.random() < 0.5:
        cfg.update(step_size=0.3, lambd=0.05)
    params = _away_from_kink(rng, z, init_crate_params(rng, c, h, d, to_out=to_out), cfg)
    return Sample(inputs={"z": z}, params=params, config=cfg)


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _reference(z, params, *, num_heads, step_size=0.1, lambd=0.1, scale=None, eps=1e-5):
    # the paper's formulas, one batch element and head at a time
    c = z.shape[-1]
    one, zero = np.ones(c), np.zeros(c)
    out = np.empty_like(z)
    u_all = params["attn.fn.qkv.weight"]
    e = u_all.shape[1]
    pd = e // num_heads
    s = pd ** -0.5 if scale is None else scale
    for b in range(z.shape[0]):
        zb = z[b]
        y = _layer_norm(zb, params.get("attn.norm.weight", one), params.get("attn.norm.bias", zero), eps)
        heads = []
        for k in range(num_heads):
            wk = y @ u_all[:, k * pd:(k + 1) * pd]
            sk = s * wk @ wk.T
            ak = np.exp(sk - sk.max(1, keepdims=True))
            ak /= ak.sum(1, keepdims=True)
            heads.append(ak @ wk)
        hcat = np.concatenate(heads, axis=1)
        if "attn.fn.to_out.0.weight" in params:
            hcat = hcat @ params["attn.fn.to_out.0.weight"] + params.get("attn.fn.to_out.0.bias", zero)
        zh = zb + hcat
        x = _layer_norm(zh, params.get("ff.norm.weight", one), params.get("ff.norm.bias", zero), eps)
        dm = params["ff.fn.weight"]
        out[b] = np.maximum(x + step_size * (x @ dm - x @ dm.T @ dm) - step_size * lambd, 0.0)
    return out


def _check_scores_symmetric_weights_not(rng):
    z = rng.standard_normal((2, 5, 6))
    p = init_crate_params(rng, 6, 2, 3)
    _, c = crate_block_forward(z, p, num_heads=2)
    a = c["core"]["p"]
    s = np.log(a) + c["core"]["lse"][..., None]
    sym = float(np.abs(s - np.swapaxes(s, -1, -2)).max())
    asym = float(np.abs(a - np.swapaxes(a, -1, -2)).max())
    assert sym < 1e-12 and asym > 1e-3, (sym, asym)
    return sym


def _check_three_paths(rng):
    # dU of the tied layer == the sum of the query, key and value paths, each built by hand from the
    # cache (explicit softmax VJP, no attention core): each path is present and none is missing.
    z = rng.standard_normal((2, 4, 4))
    p = init_crate_params(rng, 4, 2, 2)
    y, c = crate_block_forward(z, p, num_heads=2)
    G = rng.standard_normal(y.shape)
    dmat, eta = p["ff.fn.weight"], 0.1
    du = G * c["u_pos"]
    dx = du + eta * (du @ dmat.T - du @ dmat.T @ dmat)
    dzh = layer_norm_backward(dx, c["ln_f"])["x"]
    dh = split_heads(dzh @ p["attn.fn.to_out.0.weight"].T, 2, 2)
    y1 = c["y1"]
    a, w = c["core"]["p"], split_heads(y1 @ p["attn.fn.qkv.weight"], 2, 2)
    da = dh @ np.swapaxes(w, -1, -2)
    ds = a * (da - (da * a).sum(-1, keepdims=True))
    s = 2 ** -0.5
    paths = [s * ds @ w, s * np.swapaxes(ds, -1, -2) @ w, np.swapaxes(a, -1, -2) @ dh]
    total = sum(np.einsum("bnc,bnd->cd", y1, merge_heads(t)) for t in paths)
    err = float(np.abs(total - crate_block_backward(G, c)["attn.fn.qkv.weight"]).max())
    smallest = min(float(np.abs(t).max()) for t in paths)
    assert err < 1e-12 and smallest > 1e-4, (err, smallest)
    return err


def _check_ista_is_proximal_step(rng):
    # the ISTA update is ReLU(X - eta * grad f(X) - eta * lambda) with f(A) = 1/2 ||X - A D^T||^2, whose
    # gradient at A = X is -(X D - X D^T D) (the paper's proximal step); the gradient checked by FD of f.
    c = 4
    x = rng.standard_normal((3, c))
    dm = rng.standard_normal((c, c)) / 2

    def f(a):
        return 0.5 * np.sum((x - a @ dm.T) ** 2)

    grad = -(x @ dm - x @ dm.T @ dm)
    h = 1e-6
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = (f(x + e) - f(x - e)) / (2 * h)
    err = float(np.abs(fd - grad).max())
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="crate_mssa_ista", family="1-softmax", tier="T2",
        title="CRATE white-box block: MSSA with tied QKV, then one ISTA step",
        paper="Y. Yu, S. Buchanan, D. Pai, T. Chu, Z. Wu, S. Tong, B. D. Haeffele, Y. Ma, White-Box Transformers "
              "via Sparse Rate Reduction, NeurIPS 2023, arXiv 2306.01129",
        official_code="Ma-Lab-Berkeley/CRATE",
        forward=crate_block_forward, backward=crate_block_backward, sample=_sample, reference=_reference,
        docs="softmax/masks-and-selection.md#crate-mssa-ista",
        checks={"scores_symmetric_weights_not": _check_scores_symmetric_weights_not,
                "tied_projection_three_paths": _check_three_paths,
                "ista_is_proximal_gradient_step": _check_ista_is_proximal_step},
    ),
)
