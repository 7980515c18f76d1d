r"""MoNo CoTAP: cross-scale optimal-transport assignment and projection between points and latent tokens.

Paper: Zijiang Yang et al., "MoNo: Multiscale Optimal Transport Neural Operator for Solving PDEs on
General Geometries", arXiv 2608.09764. Upstream: ZijiangY1116/MoNo ``utils/models/mono.py``
(``CoTAP``, ``MONOMLP``, ``MONORowNormalizedLinear``, ``FasterSinkhornRouter``) and
``utils/models/op.py`` (``sinkhorn_reference``, ``faster_sinkhorn``)
@ 60d086a45d4929769796fb3b2dfacc6680528f3b.

Which part of the model
-----------------------
MoNo is a four-level U-shaped hierarchy: point features are projected onto $M_1$ latent tokens,
those onto $M_2 = M_1/2$ tokens and so on, with self-attention blocks at every level and the way
back up through the same assignments. CoTAP is the projection between two adjacent levels; the
latent attention stacks, the EMA trunk projector and the output MLP are ordinary layers and are
left to this text. One CoTAP stage, for source points/tokens $i = 1..N$ with routing anchors
$a_i$ (features of the coordinates, propagated level to level) and target tokens $j = 1..M$:

Forward
-------
Logits from a residual MLP (``attention_projector``, GELU, hidden width $h$):

$$h_0 = \mathrm{GELU}(a W_{in} + b_{in}),\quad h_{l+1} = h_l + \mathrm{GELU}(h_l W_l + b_l)\ (l < n_{layer}),
\quad S = h_{n} W_{out} + b_{out}\in\mathbb R^{N\times M}.$$

With ``row_normalized`` output (upstream's first stage when ``normed_first_stage``) the last layer
has no bias and the weight columns are unit vectors times one learned scale:
$W_{out} = s\,[w_j/\max(\lVert w_j\rVert, 10^{-12})]_j$.

Entropic optimal transport between uniform marginals $\mu = \mathbf 1/N$, $\nu = \mathbf 1/M$, by
$T$ = ``n_iter`` log-domain Sinkhorn rounds (upstream 8, temperature $\tau$ = 1), each a row then a
column normalisation of $L_0 = S/\tau$ (the shared ``sinkhorn_log`` with $2T$ steps; it equals
upstream's dual updates $u = \log\mu - \mathrm{lse}_j(L_0 + v)$, $v = \log\nu - \mathrm{lse}_i(L_0 + u)$
starting from $v = 0$):

$$P = \exp(L_{2T}),\qquad P^\top\mathbf 1 = \nu\ \text{exactly},\qquad P\mathbf 1\approx\mu.$$

Balanced bidirectional projections (``score_encode`` $= MP$, ``score_decode`` $= NP$):

$$Z = M\,P^\top X\in\mathbb R^{M\times D}\ (\text{down: every token averages its points, equal mass }1/M),
\qquad X' = N\,P\,Z'\in\mathbb R^{N\times D}\ (\text{up}).$$

The layer returns both, stacked along the token axis: ``out[:, :M]`` $= Z$ (the encoding of ``x``)
and ``out[:, M:]`` $= X'$ (the decoding of ``z``, the processed latent of this level). In MoNo the
next level's anchors are the encoding of the anchors, $MP^\top a$ (pass ``x = anchor``).

Backward
--------
With $G_Z, G_{X'}$ the two halves of the upstream gradient:
$dX = M\,P\,G_Z$, $dZ' = N\,P^\top G_{X'}$, $\bar P = M\,X G_Z^\top + N\,G_{X'}Z'^\top$ and
$dL_{2T} = \bar P\odot P$. Through Sinkhorn, two choices (keyword ``grad``):

* ``"unrolled"`` (upstream: autograd through ``sinkhorn_reference`` on CPU, the reversed recurrence
  of the Triton kernel on CUDA; both differentiate the finite iteration): every normalisation step
  $L' = L - \mathrm{lse}_{ax}(L) + c$ has the VJP $dL = dL' - \mathrm{softmax}_{ax}(L)\odot\sum_{ax}dL'$
  (``sinkhorn_log_vjp``), applied in reverse. Exact for the computed $P$; the FD tests check it.
* ``"implicit"``: the implicit-function gradient of the converged plan,
  $dL_0 = P\odot(\bar P + \alpha\oplus\beta)$ with $\alpha,\beta$ from an $(N+M)$ linear system
  (``refattn.operators.common.sinkhorn_implicit_vjp``, derivation there). O(1) memory in $T$, but the
  gradient of the *limit*: it agrees with the unrolled one only as $T\to\infty$ (check
  ``implicit_equals_unrolled_at_convergence``).

Then $dS = dL_0/\tau$ and the MLP VJP ($d h_l = dh_{l+1} + (dh_{l+1}\odot\mathrm{GELU}'(z_l))W_l^\top$;
for the row-normalised layer $dW = (dW_n - W_n\,\mathrm{diag}(W_n^\top dW_n))/\lVert w\rVert$ per
column with $dW_n = s\,h^\top dS$, $ds = \sum dW_{eff}\odot W_n$).

Conventions
-----------
* ``n_iter`` = 8, ``temperature`` = 1 (upstream ``FasterSinkhornRouter`` defaults, fixed in CoTAP).
* Upstream's Triton kernel clamps $\log P \le 0$ before exponentiating; the CPU reference (and
  refattn) do not. $L_{2T}\le 0$ holds after any column step ($P_{ij}\le\nu_j$), so the clamp only
  acts on round-off.
* ``inverse_update`` (column step first) is upstream's non-default option; not implemented.
* Row-normalised output layer: upstream initialises ``global_scale`` = 3 and uses it on stage 0
  when ``normed_first_stage`` (true in the released MoNo configs except Darcy).
* Weights ``(in, out)`` = ``nn.Linear.weight.T``; ``global_scale`` is a 0-d array.

Agreement with upstream
-----------------------
``sinkhorn_reference`` + ``CoTAP.build_mapping``/``encode``/``decode`` of the upstream files run in
PyTorch float64 on CPU (``timm`` stubbed, it only initialises weights) against this module ($B = 2$,
$N = 40$, $M = 7$, $D = 6$, three hidden layers), maximum error relative to the largest entry:
output 3.3e-15, every gradient <= 5.5e-15, with the standard and the row-normalised output layer
(the output bias's gradient is structurally zero, roundoff ~1e-12 in both).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..attention.linear.sinkformer import sinkhorn_log, sinkhorn_log_vjp
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .common import sinkhorn_implicit_vjp

__all__ = ["cotap_forward", "cotap_backward", "cotap", "cotap_project", "init_cotap_params"]

_P = "attention_projector"
_NORM_EPS = 1e-12          # F.normalize default in MONORowNormalizedLinear
GRADS = ("unrolled", "implicit")


def _n_hidden(params) -> int:
    n = 0
    while f"{_P}.hidden.{n}.weight" in params:
        n += 1
    return n


def _validate(anchor, x, z, params, n_iter, temperature, grad):
    anchor = as_float(anchor, "anchor", ndim=3)
    b, n, da = anchor.shape
    x = as_float(x, "x", ndim=3)
    if x.shape[:2] != (b, n):
        raise ValueError(f"x must have shape (B={b}, N={n}, D): one feature row per anchor; got {x.shape}")
    z = as_float(z, "z", ndim=3)
    if z.shape[0] != b or z.shape[2] != x.shape[2]:
        raise ValueError(f"z must have shape (B={b}, M, D={x.shape[2]}) (latent tokens of x's width); got {z.shape}")
    m = z.shape[1]
    check_int(n_iter, "n_iter", minimum=1)
    temperature = check_positive(temperature, "temperature")
    check_choice(grad, "grad", GRADS)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of {_P}.* arrays; got {type(params).__name__}")
    w_in = params.get(f"{_P}.input.weight")
    if w_in is None:
        raise ValueError(f"params is missing '{_P}.input.weight' (expected shape (D_anchor={da}, hidden))")
    hid = as_float(w_in, f"{_P}.input.weight", ndim=2).shape[1]
    rownorm = f"{_P}.output.global_scale" in params
    spec = linear_prefixed_spec(f"{_P}.input", da, hid)
    for i in range(_n_hidden(params)):
        spec.update(linear_prefixed_spec(f"{_P}.hidden.{i}", hid, hid))
    spec.update(linear_prefixed_spec(f"{_P}.output", hid, m, bias=not rownorm))
    if rownorm:
        spec[f"{_P}.output.global_scale"] = ()
    p = check_params(params, spec)
    dt = compute_dtype(anchor, x, z, *p.values())
    return (anchor.astype(dt, copy=False), x.astype(dt, copy=False), z.astype(dt, copy=False), cast_all(dt, p),
            rownorm, int(n_iter), temperature)


def _mlp_forward(p, a, rownorm):
    pre = [linear_prefixed(p, f"{_P}.input", a)]
    hs = [gelu(pre[0])]
    for i in range(_n_hidden(p)):
        pre.append(linear_prefixed(p, f"{_P}.hidden.{i}", hs[-1]))
        hs.append(hs[-1] + gelu(pre[-1]))
    c = {"pre": pre, "hs": hs, "a": a}
    if rownorm:
        w = p[f"{_P}.output.weight"]
        norm = np.linalg.norm(w, axis=0)
        wn = w / np.maximum(norm, _NORM_EPS)
        c.update(norm=norm, wn=wn)
        return hs[-1] @ (wn * p[f"{_P}.output.global_scale"]), c
    return linear_prefixed(p, f"{_P}.output", hs[-1]), c


def _mlp_backward(grads, p, ds, c, rownorm):
    hs, pre = c["hs"], c["pre"]
    h = hs[-1]
    if rownorm:
        scale, wn = p[f"{_P}.output.global_scale"], c["wn"]
        deff = h.reshape(-1, h.shape[-1]).T @ ds.reshape(-1, ds.shape[-1])
        grads[f"{_P}.output.global_scale"] = np.asarray(np.sum(deff * wn), dtype=h.dtype)
        dwn = deff * scale
        big = c["norm"] > _NORM_EPS
        proj = dwn - wn * np.sum(wn * dwn, axis=0)
        grads[f"{_P}.output.weight"] = np.where(big, proj / np.maximum(c["norm"], _NORM_EPS), dwn / _NORM_EPS)
        dh = ds @ (wn * scale).T
    else:
        dh = linear_prefixed_vjp(grads, p, f"{_P}.output", ds, h)
    for i in reversed(range(len(hs) - 1)):
        dz = dh * gelu_grad(pre[i + 1])
        dh = dh + linear_prefixed_vjp(grads, p, f"{_P}.hidden.{i}", dz, hs[i])
    return linear_prefixed_vjp(grads, p, f"{_P}.input", dh * gelu_grad(pre[0]), c["a"])


def cotap_forward(anchor, x, z, params, *, n_iter: int = 8, temperature: float = 1.0, grad: str = "unrolled"):
    r"""One CoTAP stage: routing logits, Sinkhorn plan, down projection of ``x`` and up projection of ``z``.

    Parameters
    ----------
    anchor : array (B, N, D_a)
        Routing anchors of the N source points/tokens (MoNo: coordinate features at level 0, the
        encoded anchors of the previous level above).
    x : array (B, N, D)
        Source features to project down.
    z : array (B, M, D)
        Latent features of this level (after its attention stack) to project back up.
    params : dict
        ``attention_projector.input.{weight,bias}`` (D_a, h), ``.hidden.{i}.{weight,bias}`` (h, h)
        for ``i < n_layer``, ``.output.weight`` (h, M) and either ``.output.bias`` (M,) or (row
        normalised) ``.output.global_scale`` (0-d); weights ``(in, out)`` = ``nn.Linear.weight.T``.
    n_iter : int
        Sinkhorn rounds (row + column), upstream 8.
    temperature : float
        $\tau$ in $L_0 = S/\tau$, upstream 1.
    grad : {"unrolled", "implicit"}
        Sinkhorn backward (module docstring); ``"unrolled"`` is upstream's and the exact gradient.

    Returns
    -------
    out, cache
        ``out (B, M + N, D)``: ``out[:, :M]`` $= MP^\top x$, ``out[:, M:]`` $= NPz$;
        ``cache["plan"]`` is $P$ (B, N, M).
    """
    anchor, x, z, p, rownorm, n_iter, tau = _validate(anchor, x, z, params, n_iter, temperature, grad)
    n, m = x.shape[1], z.shape[1]
    s, mlp_c = _mlp_forward(p, anchor, rownorm)
    lt, ps = sinkhorn_log(s / tau, 2 * n_iter)
    plan = np.exp(lt)
    enc = m * (np.swapaxes(plan, -1, -2) @ x)
    dec = n * (plan @ z)
    out = np.concatenate([enc, dec], axis=1)
    cache = dict(p=p, x=x, z=z, plan=plan, ps=ps, mlp=mlp_c, rownorm=rownorm, tau=tau, grad=grad,
                 out_shape=out.shape)
    return out, cache


def cotap_backward(dout, cache):
    """Gradients of :func:`cotap_forward`: ``anchor``, ``x``, ``z`` and every params key, through the
    unrolled Sinkhorn iterations or (``grad="implicit"``) the fixed-point gradient."""
    p, x, z, plan = cache["p"], cache["x"], cache["z"], cache["plan"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    n, m = x.shape[1], z.shape[1]
    gz, gx = g[:, :m], g[:, m:]
    grads = {"x": m * (plan @ gz), "z": n * (np.swapaxes(plan, -1, -2) @ gx)}
    dplan = m * (x @ np.swapaxes(gz, -1, -2)) + n * (gx @ np.swapaxes(z, -1, -2))
    if cache["grad"] == "unrolled":
        dl0 = sinkhorn_log_vjp(dplan * plan, cache["ps"])
    else:
        dl0 = sinkhorn_implicit_vjp(plan, dplan)
    grads["anchor"] = _mlp_backward(grads, p, dl0 / cache["tau"], cache["mlp"], cache["rownorm"])
    return grads


def cotap(anchor, x, z, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`cotap_forward`."""
    return cotap_forward(anchor, x, z, params, **config)[0]


def cotap_project(anchor, x, z, params, **config):
    """``(z_enc, x_dec)``: the down projection $MP^\\top x$ (B, M, D) and the up projection $NPz$ (B, N, D)."""
    out = cotap_forward(anchor, x, z, params, **config)[0]
    m = np.shape(z)[1]
    return out[:, :m], out[:, m:]


def init_cotap_params(rng, d_anchor: int, n_mode: int, *, hidden=None, n_layer: int = 3,
                      row_normalized: bool = False, scale_init: float = 3.0, dtype=np.float64) -> dict:
    """CoTAP's ``attention_projector`` as upstream builds it (``MONOMLP(n_dim, n_dim, n_mode, n_layer)``):
    PyTorch default linears, ``global_scale = scale_init`` for the row-normalised output."""
    hidden = d_anchor if hidden is None else check_int(hidden, "hidden", minimum=1)
    p = init_linear_prefixed(rng, d_anchor, hidden, f"{_P}.input")
    for i in range(check_int(n_layer, "n_layer", minimum=0)):
        p.update(init_linear_prefixed(rng, hidden, hidden, f"{_P}.hidden.{i}"))
    p.update(init_linear_prefixed(rng, hidden, n_mode, f"{_P}.output", bias=not row_normalized))
    if row_normalized:
        p[f"{_P}.output.global_scale"] = np.asarray(scale_init)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, row_normalized=False):
    if size == "tiny":
        n, m, d, hid, layers, it = int(rng.integers(3, 5)), 3, 2, 3, 1, int(rng.integers(1, 4))
    else:
        n, m, d, hid, layers, it = int(rng.integers(8, 13)), int(rng.integers(3, 6)), 3, 5, 2, 8
    p = init_cotap_params(rng, d, m, hidden=hid, n_layer=layers, row_normalized=row_normalized, scale_init=1.5)
    if not row_normalized:
        p[f"{_P}.output.bias"] = 0.3 * rng.standard_normal(m)
    inputs = {"anchor": rng.standard_normal((2, n, d)), "x": rng.standard_normal((2, n, d)),
              "z": rng.standard_normal((2, m, d))}
    return Sample(inputs=inputs, params=p, config={"n_iter": it, "temperature": 0.8})


def _reference(anchor, x, z, params, *, n_iter=8, temperature=1.0, grad="unrolled"):
    # Upstream's dual-potential Sinkhorn written out (u, v vectors, explicit logsumexp) and the MLP
    # by plain matrix products.
    def lse(t, axis):
        mx = t.max(axis=axis, keepdims=True)
        return np.squeeze(mx, axis) + np.log(np.exp(t - mx).sum(axis=axis))

    def gl(t):
        return gelu(t)

    h = gl(anchor @ params[f"{_P}.input.weight"] + params[f"{_P}.input.bias"])
    for i in range(_n_hidden(params)):
        h = h + gl(h @ params[f"{_P}.hidden.{i}.weight"] + params[f"{_P}.hidden.{i}.bias"])
    w = params[f"{_P}.output.weight"]
    if f"{_P}.output.global_scale" in params:
        s = h @ (w / np.linalg.norm(w, axis=0) * params[f"{_P}.output.global_scale"])
    else:
        s = h @ w + params[f"{_P}.output.bias"]
    lg = s / temperature
    b, n, m = lg.shape
    u, v = np.zeros((b, n)), np.zeros((b, m))
    for _ in range(n_iter):
        u = -np.log(n) - lse(lg + v[:, None, :], -1)
        v = -np.log(m) - lse(lg + u[:, :, None], 1)
    plan = np.exp(lg + u[:, :, None] + v[:, None, :])
    return np.concatenate([np.einsum("bij,bic->bjc", plan * m, x), np.einsum("bij,bjc->bic", plan * n, z)], axis=1)


def _check_balanced_marginals(rng):
    # Column sums of the plan are exactly 1/M after the last column step (the down projection of a
    # constant is that constant, every token gets mass 1/M); row sums reach 1/N as n_iter grows.
    s = _sample(rng, "small")
    a, x = s.inputs["anchor"], s.inputs["x"]
    out, c = cotap_forward(a, np.ones_like(x), s.inputs["z"], s.params, n_iter=8)
    m = s.inputs["z"].shape[1]
    e_cols = float(np.abs(out[:, :m] - 1.0).max())
    _, c200 = cotap_forward(a, x, s.inputs["z"], s.params, n_iter=200)
    e_rows = float(np.abs(c200["plan"].sum(-1) * x.shape[1] - 1.0).max())
    assert e_cols < 1e-12 and e_rows < 1e-10, f"marginals: columns {e_cols:.2e}, rows after 200 rounds {e_rows:.2e}"
    return max(e_cols, e_rows)


def _check_implicit_equals_unrolled(rng):
    # At convergence (many rounds) the unrolled backward equals the implicit fixed-point gradient.
    s = _sample(rng, "small")
    out, cu = cotap_forward(**s.inputs, params=s.params, n_iter=300)
    _, ci = cotap_forward(**s.inputs, params=s.params, n_iter=300, grad="implicit")
    g = rng.standard_normal(out.shape)
    gu, gi = cotap_backward(g, cu), cotap_backward(g, ci)
    # relative to the largest gradient: the output bias's gradient is structurally zero (a
    # column shift of the logits is removed by the column normalisation)
    scale = max(float(np.abs(v).max()) for v in gu.values())
    err = max(float(np.abs(gu[k] - gi[k]).max()) for k in gu) / scale
    assert err < 1e-8, f"implicit and unrolled gradients differ by {err:.2e} (relative) at convergence"
    _, c8 = cotap_forward(**s.inputs, params=s.params, n_iter=1)
    _, c8i = cotap_forward(**s.inputs, params=s.params, n_iter=1, grad="implicit")
    far = float(np.abs(cotap_backward(g, c8)["anchor"] - cotap_backward(g, c8i)["anchor"]).max())
    assert far > 1e-6, "after one round the implicit gradient should differ from the exact unrolled one"
    return err


def _check_point_permutation(rng):
    # Permuting the source points permutes the up projection and leaves the down projection unchanged.
    s = _sample(rng, "small")
    n, m = s.inputs["x"].shape[1], s.inputs["z"].shape[1]
    base = cotap(**s.inputs, params=s.params, **s.config)
    perm = rng.permutation(n)
    out = cotap(s.inputs["anchor"][:, perm], s.inputs["x"][:, perm], s.inputs["z"], s.params, **s.config)
    err = max(float(np.abs(out[:, :m] - base[:, :m]).max()), float(np.abs(out[:, m:] - base[:, m:][:, perm]).max()))
    assert err < 1e-12, f"CoTAP is not point-permutation equivariant: {err:.2e}"
    return err


def _check_gradcheck_row_normalized(rng):
    # The row-normalised output layer (upstream's first stage) by finite differences.
    from ..testing import gradcheck

    s = _sample(rng, "tiny", row_normalized=True)
    return gradcheck(cotap_forward, cotap_backward, s).max_rel


register(
    Mechanism(
        slug="mono_cotap_ot_projection", family="3-operator", tier="T3",
        title="MoNo CoTAP: entropic-OT point <-> latent projection (Sinkhorn, unrolled or implicit backward)",
        paper="Zijiang Yang et al., MoNo: Multiscale Optimal Transport Neural Operator for Solving PDEs on General "
              "Geometries, arXiv 2608.09764",
        forward=cotap_forward, backward=cotap_backward, sample=_sample, reference=_reference,
        docs="operators/operator-attention-t3.md#mono-cotap",
        checks={"balanced_marginals": _check_balanced_marginals,
                "implicit_equals_unrolled_at_convergence": _check_implicit_equals_unrolled,
                "point_permutation": _check_point_permutation,
                "gradcheck_row_normalized": _check_gradcheck_row_normalized},
    ),
)
