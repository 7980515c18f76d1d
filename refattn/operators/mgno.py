r"""MgNO: a neural-operator layer whose linear operator is one multigrid V-cycle of convolutions.

Paper: He, Liu, Xu, "MgNO: Efficient Parameterization of Linear Operators via Multigrid",
ICLR 2024, arXiv 2310.19809. Upstream: xlliu2017/MgNO ``models.py`` (``MgIte``, ``MgIte_init``,
``Restrict``, ``MgConv_DC``, ``MgNO_DC``; ``darcy.py`` for the defaults)
@ 3a68a900bcccdb2246fd86ede4b001440a56c152.

Layer
-----
The paper's neuron $\mathcal O_i(u) = \sigma(\sum_j\mathcal W_{ij}u_j + \mathcal B_{ij})$ with the
multi-channel linear operator $\mathcal W$ parameterised by a V-cycle (``MgConv_DC``) and, as in
``MgNO_DC``, a pointwise linear map with bias beside it:

$$\mathrm{out} = \sigma\big(\mathcal W_{\mathrm{Mg}}(u) + W_{1\times1}u + b\big).$$

$\mathcal W_{\mathrm{Mg}}$ on input $f$ ("right-hand side" channels) with levels
$\ell = 0..L-1$ and ``num_iteration[l] = (pre, post)``:

* level 0: $u^0 = S^{0,0}\star f$ (``MgIte_init``), then ``pre - 1`` smoothing steps
  $u \leftarrow u + S\star(f - A\star u)$ (``MgIte``), each with its own 3x3 convolutions $A$
  ($C_u\to C_f$) and $S$ ($C_f\to C_u$);
* level $\ell > 0$: restriction (``Restrict``) $f^\ell = R^\ell\star f^{\ell-1}$ — or, with
  ``use_res``, the residual $R^\ell\star(f^{\ell-1} - A\star u^{\ell-1})$ — and
  $u^\ell = \Pi^\ell\star u^{\ell-1}$ (3x3, stride 2), then ``pre`` smoothing steps;
* up the V: for $j = L-2..0$, $u^j \leftarrow u^j + P^j\star^\top u^{j+1}$ (``ConvTranspose2d``
  4x4, stride 2, padding 1: exact 2x prolongation) and ``post`` smoothing steps on level $j$.

The output is $u^0$. The V-cycle is linear in $f$ (the convolutions have no bias by default).

Backward
--------
The forward is recorded as a tape of convolutions, transposed convolutions, sums and differences
on named intermediate fields; the backward runs it in reverse, accumulating the gradient of each
field over all its uses (a level's $u$ feeds both the restriction and the up-sweep; $f^\ell$ feeds
every smoothing step of its level). Convolution: :func:`refattn.nn.conv.conv_vjp` (with the
padding mode's adjoint); prolongation: :func:`refattn.nn.conv.conv_transpose_vjp`; $a - b$ sends
$(+\bar y, -\bar y)$. The outer layer: $\bar z = \bar y\,\sigma'(z)$ into both branches.

Conventions
-----------
* Parameters: upstream ``MgNO_DC.conv_list[i].state_dict()`` keys under ``conv.`` (e.g.
  ``conv.layer0.0.S.weight``, ``conv.layer1.0.Pi.weight``, ``conv.layer1.0.R.weight``,
  ``conv.layer1.1.A.weight``, ``conv.post_smooth_layer0.0.A.weight``, ``conv.RTlayers.0.weight``),
  all in PyTorch's conv layouts; the 1x1 skip ``linear_list[i]`` as ``linear.weight (C_u, C_f, 1, 1)``
  and ``linear.bias``. Optional ``A``/``S`` biases (upstream ``bias=True``) are read when present.
* ``num_iteration``: upstream Darcy default ``((1, 0), (1, 0), (1, 0), (2, 0), (2, 0))``;
  ``padding_mode`` of the 3x3 convolutions (``"zeros"`` for Darcy, ``"circular"`` for
  Navier-Stokes; the prolongation always zero-pads, as ``ConvTranspose2d``); ``use_res`` (default
  False as upstream: the right-hand side, not the residual, is restricted); ``activation``
  ``"gelu"`` (default), ``"relu"``, ``"tanh"``, ``"silu"``; ``linear_skip`` (``MgNO_DC`` has it).
* The post-smoothing layers of the coarsest level exist upstream but are never called; they are
  not parameters here. ``MgConv`` (the Navier-Stokes variant with a LayerNorm after each
  prolongation, fixed to 64x64 grids) is not implemented.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad, silu, silu_grad
from ..nn.conv import PADDING_MODES, conv_apply, conv_transpose_apply, conv_transpose_vjp, conv_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["mgno_param_shapes", "mgno_vcycle", "mgno_layer_forward", "mgno_layer_backward", "mgno_layer",
           "init_mgno_params"]

DARCY_ITERATIONS = ((1, 0), (1, 0), (1, 0), (2, 0), (2, 0))
_ACTS = ("gelu", "relu", "tanh", "silu")


def mgno_param_shapes(c_u: int, c_f: int, num_iteration=DARCY_ITERATIONS, *, use_res: bool = False) -> dict:
    """``{key: shape}`` of the V-cycle's weights (``conv.`` prefix) and the 1x1 skip (``linear.``)."""
    s = {}
    for level, (pre, post) in enumerate(num_iteration):
        if level == 0:
            s["conv.layer0.0.S.weight"] = (c_u, c_f, 3, 3)
            steps = range(1, pre)
        else:
            s[f"conv.layer{level}.0.Pi.weight"] = (c_u, c_u, 3, 3)
            s[f"conv.layer{level}.0.R.weight"] = (c_f, c_f, 3, 3)
            if use_res:
                s[f"conv.layer{level}.0.A.weight"] = (c_f, c_u, 3, 3)
            steps = range(1, pre + 1)
        for i in steps:
            s[f"conv.layer{level}.{i}.A.weight"] = (c_f, c_u, 3, 3)
            s[f"conv.layer{level}.{i}.S.weight"] = (c_u, c_f, 3, 3)
        if level < len(num_iteration) - 1:
            for i in range(post):
                s[f"conv.post_smooth_layer{level}.{i}.A.weight"] = (c_f, c_u, 3, 3)
                s[f"conv.post_smooth_layer{level}.{i}.S.weight"] = (c_u, c_f, 3, 3)
            s[f"conv.RTlayers.{level}.weight"] = (c_u, c_u, 4, 4)
    return s


class _Tape:
    """SSA record of the V-cycle: each op writes one new named field."""

    def __init__(self, p, mode):
        self.p, self.mode, self.ops, self.vals, self.n = p, mode, [], {}, 0

    def new(self, value):
        self.n += 1
        self.vals[self.n] = value
        return self.n

    def conv(self, key, a, stride=1):
        w = self.p[f"{key}.weight"]
        y = conv_apply(self.vals[a], w, self.p.get(f"{key}.bias"), stride=stride, padding=1, padding_mode=self.mode)
        self.ops.append(("conv", key, a, stride))
        return self.new(y)

    def prolong(self, key, a):
        y = conv_transpose_apply(self.vals[a], self.p[f"{key}.weight"], stride=2, padding=1)
        self.ops.append(("prolong", key, a, None))
        return self.new(y)

    def combine(self, a, b, sign):
        self.ops.append(("combine", sign, a, b))
        return self.new(self.vals[a] + sign * self.vals[b])

    def smooth(self, key, u, f):
        return self.combine(u, self.conv(f"{key}.S", self.combine(f, self.conv(f"{key}.A", u), -1.0)), 1.0)


def _vcycle(f, p, num_iteration, mode, use_res):
    t = _Tape(p, mode)
    fv = t.new(f)
    levels = []
    u = None
    for level, (pre, _) in enumerate(num_iteration):
        if level == 0:
            u = t.conv("conv.layer0.0.S", fv)
            steps = range(1, pre)
        else:
            src = t.combine(fv, t.conv(f"conv.layer{level}.0.A", u), -1.0) if use_res else fv
            fv = t.conv(f"conv.layer{level}.0.R", src, stride=2)
            u = t.conv(f"conv.layer{level}.0.Pi", u, stride=2)
            steps = range(1, pre + 1)
        for i in steps:
            u = t.smooth(f"conv.layer{level}.{i}", u, fv)
        levels.append((u, fv))
    up = levels[-1][0]
    for j in range(len(num_iteration) - 2, -1, -1):
        u, fj = levels[j]
        u = t.combine(u, t.prolong(f"conv.RTlayers.{j}", up), 1.0)
        for i in range(num_iteration[j][1]):
            u = t.smooth(f"conv.post_smooth_layer{j}.{i}", u, fj)
        up = u
    return t, up


def _vcycle_vjp(t, out_id, g):
    grads, gv = {}, {out_id: g}

    def acc(store, k, v):
        store[k] = store[k] + v if k in store else v

    for n_out, (kind, a0, a1, a2) in zip(range(t.n, 1, -1), reversed(t.ops)):
        g = gv.pop(n_out, None)
        if g is None:
            continue
        if kind == "combine":
            acc(gv, a1, g)
            acc(gv, a2, a0 * g)
            continue
        w = t.p[f"{a0}.weight"]
        if kind == "conv":
            r = conv_vjp(g, t.vals[a1], w, stride=a2, padding=1, padding_mode=t.mode, has_bias=f"{a0}.bias" in t.p)
        else:
            r = conv_transpose_vjp(g, t.vals[a1], w, stride=2, padding=1, has_bias=False)
        acc(gv, a1, r["x"])
        acc(grads, f"{a0}.weight", r["weight"])
        if "bias" in r:
            acc(grads, f"{a0}.bias", r["bias"])
    return gv.get(1, np.zeros_like(t.vals[1])), grads


def _validate(u, params, num_iteration, padding_mode, use_res, activation, linear_skip):
    u = as_float(u, "u", ndim=4)
    check_choice(padding_mode, "padding_mode", PADDING_MODES)
    check_choice(activation, "activation", _ACTS)
    for name, flag in (("use_res", use_res), ("linear_skip", linear_skip)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    try:
        its = tuple((int(a), int(b)) for a, b in num_iteration)
    except (TypeError, ValueError):
        raise TypeError(f"num_iteration must be a sequence of (pre, post) integer pairs; got {num_iteration!r}") from None
    if not its or its[0][0] < 1 or any(a < 0 or b < 0 for a, b in its):
        raise ValueError(f"num_iteration needs >= 1 level, pre >= 1 on level 0 and no negative counts; got {its}")
    h, w = u.shape[2:]
    if h % 2 ** (len(its) - 1) or w % 2 ** (len(its) - 1):
        raise ValueError(f"u's grid {(h, w)} must be divisible by 2^(levels-1) = {2 ** (len(its) - 1)} for "
                         f"{len(its)} multigrid levels")
    if not isinstance(params, dict) or params.get("conv.layer0.0.S.weight") is None:
        raise ValueError("params must be a dict with the V-cycle weights (conv.layer0.0.S.weight (C_u, C_f, 3, 3), ...)")
    c_u = as_float(params["conv.layer0.0.S.weight"], "conv.layer0.0.S.weight", ndim=4).shape[0]
    spec = mgno_param_shapes(c_u, u.shape[1], its, use_res=use_res)
    optional = []
    for key in list(spec):
        if key.endswith((".A.weight", ".S.weight")):
            bias = key[:-len("weight")] + "bias"
            spec[bias] = (spec[key][0],)
            optional.append(bias)
    if linear_skip:
        spec.update({"linear.weight": (c_u, u.shape[1], 1, 1), "linear.bias": (c_u,)})
    p = check_params(params, spec, optional=tuple(optional), where="mgno_layer")
    dt = compute_dtype(u, *p.values())
    return u.astype(dt, copy=False), cast_all(dt, p), its, dt


def mgno_vcycle(f, params, *, num_iteration=DARCY_ITERATIONS, padding_mode: str = "zeros",
                use_res: bool = False) -> np.ndarray:
    """The linear V-cycle operator $\\mathcal W_{\\mathrm{Mg}}f$ alone (``MgConv_DC.forward``)."""
    f, p, its, _ = _validate(f, {k: v for k, v in params.items() if k.startswith("conv.")}, num_iteration,
                             padding_mode, use_res, "gelu", False)
    tape, top = _vcycle(f, p, its, padding_mode, use_res)
    return tape.vals[top]


def _act(z, activation):
    if activation == "gelu":
        return gelu(z), gelu_grad(z)
    if activation == "silu":
        return silu(z), silu_grad(z)
    if activation == "tanh":
        t = np.tanh(z)
        return t, 1.0 - t * t
    return np.maximum(z, 0.0), (z > 0).astype(z.dtype)


def mgno_layer_forward(u, params, *, num_iteration=DARCY_ITERATIONS, padding_mode: str = "zeros",
                       use_res: bool = False, activation: str = "gelu", linear_skip: bool = True):
    r"""One MgNO layer $\sigma(\mathcal W_{\mathrm{Mg}}u + W_{1\times1}u + b)$ (upstream ``MgNO_DC``'s loop body).

    Parameters
    ----------
    u : array (B, C_f, H, W)
        Input channels (the V-cycle's right-hand side); ``H, W`` divisible by ``2^(levels-1)``.
    params : dict
        V-cycle weights under ``conv.`` (:func:`mgno_param_shapes`; PyTorch conv layouts) and, with
        ``linear_skip``, ``linear.weight (C_u, C_f, 1, 1)``, ``linear.bias (C_u,)``.
    num_iteration : sequence of (pre, post)
        Smoothing steps per level (upstream Darcy default ``((1,0),(1,0),(1,0),(2,0),(2,0))``).
    padding_mode : {"zeros", "reflect", "replicate", "circular"}
        Of the 3x3 convolutions (Darcy ``"zeros"``).
    use_res : bool
        Restrict the residual $f - Au$ instead of $f$ (upstream default False).
    activation : {"gelu", "relu", "tanh", "silu"}
    linear_skip : bool
        Add the 1x1 convolution with bias (``MgNO_DC``'s ``linear_list``).

    Returns
    -------
    out, cache
        ``out (B, C_u, H, W)``.
    """
    u, p, its, dt = _validate(u, params, num_iteration, padding_mode, use_res, activation, linear_skip)
    tape, top = _vcycle(u, p, its, padding_mode, use_res)
    z = tape.vals[top]
    if linear_skip:
        z = z + conv_apply(u, p["linear.weight"], p["linear.bias"])
    out, slope = _act(z, activation)
    return out, {"u": u, "p": p, "tape": tape, "top": top, "slope": slope, "skip": linear_skip, "shape": out.shape,
                 "dt": dt}


def mgno_layer_backward(dout, cache):
    """Gradients of :func:`mgno_layer_forward`: ``u`` and every weight (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dt"]) * cache["slope"]
    du, grads = _vcycle_vjp(cache["tape"], cache["top"], g)
    if cache["skip"]:
        r = conv_vjp(g, cache["u"], cache["p"]["linear.weight"])
        du = du + r["x"]
        grads["linear.weight"], grads["linear.bias"] = r["weight"], r["bias"]
    grads["u"] = du
    for k, v in cache["p"].items():
        grads.setdefault(k, np.zeros_like(v))
    return grads


def mgno_layer(u, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mgno_layer_forward`."""
    return mgno_layer_forward(u, params, **config)[0]


def init_mgno_params(rng, c_u: int, c_f: int, num_iteration=DARCY_ITERATIONS, *, use_res: bool = False,
                     linear_skip: bool = True, dtype=np.float64) -> dict:
    """PyTorch's default conv initialisation ($U(\\pm1/\\sqrt{\\text{fan\\_in}})$) for every weight;
    ``ConvTranspose2d``'s fan-in is its output channels times the kernel size."""
    shapes = mgno_param_shapes(c_u, c_f, num_iteration, use_res=use_res)
    if linear_skip:
        shapes.update({"linear.weight": (c_u, c_f, 1, 1), "linear.bias": (c_u,)})
    p = {}
    for k, s in shapes.items():
        fan_in = (c_f if k == "linear.bias" else (s[1] * int(np.prod(s[2:])) if len(s) == 4 else s[0]))
        bound = 1.0 / np.sqrt(fan_in)
        p[k] = rng.uniform(-bound, bound, s).astype(dtype)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        h, c_u, c_f, its, mode, res = 4, 1, 1, ((1, 1), (1, 0)), "zeros", False
    else:
        h, c_u, c_f = 8, 3, 2
        its = ((2, 1), (1, 1), (2, 0))
        mode = PADDING_MODES[int(rng.integers(0, 4))]
        res = bool(rng.integers(0, 2))
    p = {k: v * 1.5 for k, v in init_mgno_params(rng, c_u, c_f, its, use_res=res).items()}
    return Sample(inputs={"u": rng.standard_normal((2, c_f, h, h))}, params=p,
                  config={"num_iteration": its, "padding_mode": mode, "use_res": res})


def _reference(u, params, *, num_iteration=DARCY_ITERATIONS, padding_mode="zeros", use_res=False, activation="gelu",
               linear_skip=True):
    # Upstream's module structure written out directly: the MgIte / Restrict sequences per level,
    # the up-sweep over a list of (u, f) pairs, then the outer layer.
    p = params

    def c(key, x, stride=1):
        return conv_apply(x, p[f"{key}.weight"], p.get(f"{key}.bias"), stride=stride, padding=1,
                          padding_mode=padding_mode)

    out_list, f, uu = [], u, None
    for level, (pre, _) in enumerate(num_iteration):
        if level == 0:
            uu = c("conv.layer0.0.S", f)
            first = 1
        else:
            f = c(f"conv.layer{level}.0.R", f - c(f"conv.layer{level}.0.A", uu) if use_res else f, 2)
            uu = c(f"conv.layer{level}.0.Pi", uu, 2)
            first, pre = 1, pre + 1
        for i in range(first, pre):
            uu = uu + c(f"conv.layer{level}.{i}.S", f - c(f"conv.layer{level}.{i}.A", uu))
        out_list.append([uu, f])
    for j in range(len(num_iteration) - 2, -1, -1):
        uj = out_list[j][0] + conv_transpose_apply(out_list[j + 1][0], p[f"conv.RTlayers.{j}.weight"], stride=2,
                                                   padding=1)
        for i in range(num_iteration[j][1]):
            uj = uj + c(f"conv.post_smooth_layer{j}.{i}.S", out_list[j][1] - c(f"conv.post_smooth_layer{j}.{i}.A", uj))
        out_list[j][0] = uj
    z = out_list[0][0] + (conv_apply(u, p["linear.weight"], p["linear.bias"]) if linear_skip else 0.0)
    return _act(z, activation)[0]


def _check_vcycle_linear(rng):
    # W_Mg(a f + b g) = a W_Mg f + b W_Mg g: the V-cycle is a linear operator (no biases).
    its = ((2, 1), (1, 1), (1, 0))
    p = init_mgno_params(rng, 3, 2, its, use_res=True)
    f, g = rng.standard_normal((2, 2, 8, 8)), rng.standard_normal((2, 2, 8, 8))
    kw = {"num_iteration": its, "use_res": True, "padding_mode": "reflect"}
    lhs = mgno_vcycle(0.7 * f - 1.3 * g, p, **kw)
    rhs = 0.7 * mgno_vcycle(f, p, **kw) - 1.3 * mgno_vcycle(g, p, **kw)
    err = float(np.abs(lhs - rhs).max() / np.abs(rhs).max())
    assert err < 1e-13, f"the V-cycle is not linear: {err:.2e}"
    return err


def _check_vcycle_adjoint(rng):
    # <W f, v> = <f, W^T v> with W^T the backward of the V-cycle (every padding mode): the
    # reverse tape is the exact adjoint of the whole multilevel recursion.
    its = ((1, 1), (2, 1), (1, 0))
    worst = 0.0
    for mode in PADDING_MODES:
        p = init_mgno_params(rng, 2, 2, its, linear_skip=False)
        f = rng.standard_normal((2, 2, 8, 8))
        tape, top = _vcycle(f, p, its, mode, False)
        v = rng.standard_normal(tape.vals[top].shape)
        wt, _ = _vcycle_vjp(tape, top, v)
        lhs, rhs = float(np.sum(tape.vals[top] * v)), float(np.sum(f * wt))
        worst = max(worst, abs(lhs - rhs) / abs(lhs))
    assert worst < 1e-13, f"V-cycle backward is not its adjoint: {worst:.2e}"
    return worst


def _check_prolongation_exact_upsampling(rng):
    # The 4x4 stride-2 transposed convolution doubles the grid exactly; with the bilinear stencil
    # [1, 3, 3, 1]/4 (outer product) it is the standard cell-centred multigrid prolongation, which
    # reproduces a constant away from the zero-padded border.
    k = np.outer([1, 3, 3, 1], [1, 3, 3, 1]) / 16.0
    coarse = np.ones((1, 1, 4, 4))
    fine = conv_transpose_apply(coarse, k[None, None], stride=2, padding=1)
    assert fine.shape == (1, 1, 8, 8)
    err = float(np.abs(fine[0, 0, 1:-1, 1:-1] - 1.0).max())
    assert err < 1e-15, f"bilinear prolongation does not reproduce constants: {err:.2e}"
    return err


register(
    Mechanism(
        slug="mgno_multigrid_operator", family="3-operator", tier="T2",
        title="MgNO layer: sigma(V-cycle(u) + 1x1 conv(u)) with a multigrid-parameterised linear operator",
        paper="He, Liu, Xu, MgNO: Efficient Parameterization of Linear Operators via Multigrid, ICLR 2024, "
              "arXiv 2310.19809",
        official_code="xlliu2017/MgNO",
        forward=mgno_layer_forward, backward=mgno_layer_backward, sample=_sample, reference=_reference,
        docs="operators/convolutional-and-wavelet-operators.md#mgno-multigrid-operator",
        checks={"vcycle_linear": _check_vcycle_linear, "vcycle_adjoint": _check_vcycle_adjoint,
                "prolongation_exact_upsampling": _check_prolongation_exact_upsampling},
    ),
)
