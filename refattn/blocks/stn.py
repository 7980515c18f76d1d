r"""Spatial transformer: a localisation network regresses an affine map, ``affine_grid`` turns it
into a sampling grid and ``grid_sample`` reads the input there (bilinear).

Jaderberg, Simonyan, Zisserman, Kavukcuoglu, "Spatial Transformer Networks", NeurIPS 2015,
arXiv 1506.02025. The authors' code is not public; the reference PyTorch form is the official
PyTorch tutorial, pytorch/tutorials ``intermediate_source/spatial_transformer_tutorial.py``
(``Net.localization``, ``Net.fc_loc``, ``Net.stn``) @ 0023ff030645b36c18d4ac09348c194512d921a0,
whose layer names refattn uses, with ``F.affine_grid``/``F.grid_sample`` semantics exactly
(`refattn.nn.sampling`).

Forward
-------
For ``U (B, C, H, W)``: $\theta = f_{loc}(U)\in\mathbb R^{B\times2\times3}$ (the six outputs read
row-major, torch's ``view(-1, 2, 3)``); for every output pixel $i$ with normalised target
coordinates $(x^t_i, y^t_i)$ (the ``affine_grid`` base grid: $\mathrm{linspace}(-1,1)$, scaled by
$(L-1)/L$ without ``align_corners``), the source point is $(x^s_i, y^s_i)^\top =
\theta\,(x^t_i, y^t_i, 1)^\top$, and with $(u_i, v_i)$ its pixel coordinates (unnormalised as
``grid_sample`` does, then padded: zeros / border / reflection)

$$V_i^c = \sum_{n,m} U^c_{nm}\,\max(0, 1-|u_i-m|)\,\max(0, 1-|v_i-n|),$$

the paper's bilinear kernel (its eq. 5). The localisation net is, as the tutorial (``"conv"``):
$\mathrm{conv}_{k_1}\to\mathrm{maxpool}_2\to\mathrm{ReLU}\to\mathrm{conv}_{k_2}\to\mathrm{maxpool}_2\to
\mathrm{ReLU}\to$ flatten $\to\mathrm{fc}\to\mathrm{ReLU}\to\mathrm{fc}(6)$; or the paper's
fully-connected one (``"mlp"``: flatten $\to\mathrm{fc}\to\mathrm{ReLU}\to\mathrm{fc}(6)$); or any
``(forward, backward)`` pair ``forward(U, params=p) -> (theta (B, 2, 3), cache)``,
``backward(dtheta, cache) -> {"x": dU, key: grad}`` with its parameters under
``"localization.<key>"``.

Backward
--------
Two paths reach $U$. Through the sampler, $\partial V_i/\partial U_{nm}$ is the bilinear weight
(the transposed interpolation, a scatter). Through the grid (the paper's eq. 7):
$\partial V_i/\partial u_i = \sum_{nm}U_{nm}\max(0,1-|v_i-n|)\cdot\{0\ \text{if}\ |m-u_i|\ge1;\
+1\ \text{if}\ m\ge u_i;\ -1\ \text{otherwise}\}$ (likewise $v_i$), times $du/dx^s$ (the
unnormalisation and padding derivative) — `refattn.nn.sampling.grid_sample_vjp`; then
$\bar\theta_b = \sum_i \bar g_{b,i}\,(x^t_i, y^t_i, 1)$ (`refattn.nn.sampling.affine_grid_vjp`),
then back through $f_{loc}$ (linear VJPs, ReLU mask, max-pool routing with the arg-max held
fixed, conv VJPs) to its parameters and to $U$; $\bar U$ is the sum of both paths.

The sample is not differentiable where a source coordinate is an integer (the corner set
changes), at the padding's clip/reflection points, at ReLU zeros and max-pool ties; the
sampler keeps every one of them at a distance.

Conventions
-----------
``align_corners`` (False, PyTorch's default since 1.3 and the tutorial's), ``padding_mode``
(``"zeros"``; ``"border"``, ``"reflection"``), ``mode`` (``"bilinear"``; ``"nearest"`` has a
zero grid gradient), ``size`` (the output ``(H_out, W_out)``; default the input's, as the
tutorial's ``affine_grid(theta, x.size())``), ``localization`` (``"conv"``), ``pool_size`` (2, the
tutorial's ``MaxPool2d(2, stride=2)``). Linear weights are ``(in, out)`` (PyTorch
``weight.T``), conv weights PyTorch's layout. The tutorial initialises ``fc_loc.2`` to the
identity map (weight 0, bias ``[1, 0, 0, 0, 1, 0]``).

Agreement with upstream
-----------------------
The tutorial's ``localization``/``fc_loc`` modules and ``stn`` (``F.affine_grid`` +
``F.grid_sample``, written out in a scratch script; the tutorial module itself downloads MNIST
at import), float64 CPU, both ``align_corners`` and all three padding modes, on 28x28 MNIST-sized
inputs with the tutorial's layer sizes (random weights, a non-identity $\theta$): output and the
gradients of ``U`` and all eight localisation parameters agree to $3.3\times10^{-14}$ relative to
each array's largest entry (the outputs are $O(1)$, to $6.4\times10^{-14}$; the parameter
gradients are sums over 784 output pixels, up to $\sim10^3$, to $3.8\times10^{-11}$ absolute).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..nn.activations import relu
from ..nn.conv import conv_apply, conv_vjp
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.pooling import max_pool_apply, max_pool_vjp
from ..nn.sampling import affine_grid_apply, affine_grid_vjp, grid_sample_apply, grid_sample_vjp
from ..registry import Mechanism, Sample, register
from .core import add_grad, param_dim

__all__ = ["spatial_transformer_forward", "spatial_transformer_backward", "spatial_transformer",
           "LOCALIZATIONS", "localization_forward", "localization_backward"]

LOCALIZATIONS = ("conv", "mlp")
_CONVS = ("localization.0", "localization.3")
_FCS = ("fc_loc.0", "fc_loc.2")


def _loc_spec(x_shape, params, kind, pool):
    """The localisation net's params spec (widths read from the weights)."""
    spec = {}
    c, h, w = x_shape[1:]
    if kind == "conv":
        for name in _CONVS:
            co = param_dim(params, f"{name}.weight", 0, where="spatial_transformer", shape=("C_out", "C_in", "k", "k"))
            k = param_dim(params, f"{name}.weight", 2, where="spatial_transformer", shape=("C_out", "C_in", "k", "k"))
            spec[f"{name}.weight"], spec[f"{name}.bias"] = (co, c, k, k), (co,)
            c, h, w = co, (h - k + 1) // pool, (w - k + 1) // pool
            if min(h, w) < 1:
                raise ValueError(f"x of spatial size {x_shape[2:]} is too small for the localisation net "
                                 f"({name}: kernel {k}, then max-pool {pool})")
    hidden = param_dim(params, "fc_loc.0.weight", 1, where="spatial_transformer", shape=("D", "hidden"))
    spec.update(linear_prefixed_spec(_FCS[0], c * h * w, hidden))
    spec.update(linear_prefixed_spec(_FCS[1], hidden, 6))
    return spec


def localization_forward(x, params, *, kind: str = "conv", pool_size: int = 2):
    r"""Unvalidated built-in localisation net: ``x (B, C, H, W) -> (theta (B, 2, 3), cache)``
    (``"conv"``: the tutorial's conv-pool-ReLU twice then the MLP; ``"mlp"``: the MLP on the
    flattened input)."""
    steps = []
    h = x
    if kind == "conv":
        for name in _CONVS:
            a = conv_apply(h, params[f"{name}.weight"], params[f"{name}.bias"])
            m, arg = max_pool_apply(a, (pool_size, pool_size))
            steps.append((name, h, a.shape, arg, m))
            h = relu(m)
    f = h.reshape(h.shape[0], -1)
    a1 = linear_prefixed(params, _FCS[0], f)
    h1 = relu(a1)
    theta = linear_prefixed(params, _FCS[1], h1).reshape(-1, 2, 3)
    return theta, {"steps": steps, "f": f, "a1": a1, "h1": h1, "shape": h.shape, "pool": pool_size}


def localization_backward(grads: dict, params: dict, dtheta, cache):
    """Unvalidated VJP of `localization_forward`: adds the parameter gradients into ``grads`` and
    returns the gradient for ``x``."""
    dh1 = linear_prefixed_vjp(grads, params, _FCS[1], dtheta.reshape(-1, 6), cache["h1"])
    df = linear_prefixed_vjp(grads, params, _FCS[0], dh1 * (cache["a1"] > 0), cache["f"])
    dh = df.reshape(cache["shape"])
    k = cache["pool"]
    for name, h_in, a_shape, arg, m in reversed(cache["steps"]):
        da = max_pool_vjp(dh * (m > 0), arg, a_shape, (k, k))
        r = conv_vjp(da, h_in, params[f"{name}.weight"])
        add_grad(grads, f"{name}.weight", r["weight"])
        add_grad(grads, f"{name}.bias", r["bias"])
        dh = r["x"]
    return dh


def _resolve_localization(localization):
    if isinstance(localization, str):
        check_choice(localization, "localization", LOCALIZATIONS)
        return localization
    if isinstance(localization, (tuple, list)) and len(localization) == 2 and all(callable(f) for f in localization):
        return tuple(localization)
    raise TypeError(f"localization must be one of {LOCALIZATIONS} or a (forward, backward) pair of callables; "
                    f"got {type(localization).__name__}")


def spatial_transformer_forward(x, params, *, localization="conv", size=None, mode: str = "bilinear",
                                padding_mode: str = "zeros", align_corners: bool = False, pool_size: int = 2):
    r"""Spatial transformer ``V = grid_sample(U, affine_grid(f_loc(U)))`` (module docstring).

    Parameters
    ----------
    x : array (B, C, H, W)
        The input feature map $U$.
    params : dict
        The localisation net: ``"localization.0.weight"`` ``(C_1, C, k_1, k_1)``,
        ``"localization.0.bias"``, ``"localization.3.weight"`` ``(C_2, C_1, k_2, k_2)``,
        ``"localization.3.bias"`` (``"conv"`` only); ``"fc_loc.0.weight"`` ``(D, F)``,
        ``"fc_loc.0.bias"`` ``(F,)``, ``"fc_loc.2.weight"`` ``(F, 6)``, ``"fc_loc.2.bias"`` ``(6,)``
        (linear weights ``(in, out)``: PyTorch's ``weight.T``). For a custom pair, its parameters
        under ``"localization.<key>"``.
    localization : {"conv", "mlp"} or (forward, backward)
    size : tuple (H_out, W_out), optional
        Output size (default the input's).
    mode, padding_mode, align_corners
        As ``F.grid_sample`` (and ``align_corners`` for ``F.affine_grid`` too).
    pool_size : int
        The localisation net's max-pool window and stride (``"conv"``).

    Returns
    -------
    v, cache
        ``v (B, C, H_out, W_out)``.
    """
    x = as_float(x, "x", ndim=4)
    loc = _resolve_localization(localization)
    check_choice(mode, "mode", ("bilinear", "nearest"))
    check_choice(padding_mode, "padding_mode", ("zeros", "border", "reflection"))
    if not isinstance(align_corners, (bool, np.bool_)):
        raise TypeError(f"align_corners must be a bool; got {type(align_corners).__name__}")
    pool = check_int(pool_size, "pool_size", minimum=1)
    if size is None:
        out = tuple(x.shape[2:])
    elif isinstance(size, (tuple, list)) and len(size) == 2:
        out = tuple(check_int(s, "size", minimum=1) for s in size)
    else:
        raise TypeError(f"size must be None or a tuple (H_out, W_out); got {size!r}")
    if isinstance(loc, str):
        own = check_params(params, _loc_spec(x.shape, params, loc, pool), where="spatial_transformer")
        sub = None
    else:
        if not isinstance(params, dict):
            raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
        unknown = [k for k in params if not k.startswith("localization.")]
        if unknown:
            raise ValueError(f"params has unknown keys {unknown} for spatial_transformer with a custom localization "
                             f"pair; its parameters go under 'localization.<key>'")
        own = {k: as_float(v, k) for k, v in params.items()}
        sub = {k[len("localization."):]: v for k, v in own.items()}
    dt = compute_dtype(x, *own.values())
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    if sub is None:
        theta, lcache = localization_forward(x, own, kind=loc, pool_size=pool)
    else:
        theta, lcache = loc[0](x, params=cast_all(dt, sub))
        theta = np.asarray(theta)
        if theta.shape != (x.shape[0], 2, 3):
            raise ValueError(f"the localization forward must return theta of shape {(x.shape[0], 2, 3)}; "
                             f"got {theta.shape}")
    grid = affine_grid_apply(theta, out, bool(align_corners))
    cfg = {"mode": mode, "padding_mode": padding_mode, "align_corners": bool(align_corners)}
    v = grid_sample_apply(x, grid, **cfg)
    cache = {"x": x, "grid": grid, "theta": theta, "lcache": lcache, "loc": loc, "params": own, "cfg": cfg,
             "out": out, "out_shape": v.shape}
    return v, cache


def spatial_transformer_backward(dout, cache):
    r"""Gradients of `spatial_transformer_forward` for ``x`` (sampler path + localisation path) and
    every localisation parameter (module docstring)."""
    x = cache["x"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    s = grid_sample_vjp(g, x, cache["grid"], **cache["cfg"])
    dtheta = affine_grid_vjp(s["grid"], cache["out"], cache["cfg"]["align_corners"])
    grads = {}
    if isinstance(cache["loc"], str):
        dx = localization_backward(grads, cache["params"], dtheta, cache["lcache"])
    else:
        r = cache["loc"][1](dtheta, cache["lcache"])
        dx = r["x"]
        grads.update({f"localization.{k}": v for k, v in r.items() if k != "x"})
    grads["x"] = s["x"] + dx
    return grads


def spatial_transformer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `spatial_transformer_forward`."""
    return spatial_transformer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _fc_params(rng, d, hidden, scale=0.01):
    # Small first-layer weights and |bias| >= 0.4: every ReLU pre-activation stays far from 0.
    b1 = rng.uniform(0.4, 1.0, hidden) * rng.choice([-1.0, 1.0], hidden)
    return {"fc_loc.0.weight": 0.02 * rng.standard_normal((d, hidden)) / np.sqrt(d), "fc_loc.0.bias": b1,
            "fc_loc.2.weight": scale * rng.standard_normal((hidden, 6)), "fc_loc.2.bias": np.zeros(6)}


def _coords(theta, x_shape, out, align):
    """Pixel coordinates (u along W, v along H) of every sampling point, before padding."""
    grid = affine_grid_apply(theta, out, align)
    h, w = x_shape[2:]
    if align:
        return (grid[..., 0] + 1) / 2 * (w - 1), (grid[..., 1] + 1) / 2 * (h - 1)
    return ((grid[..., 0] + 1) * w - 1) / 2, ((grid[..., 1] + 1) * h - 1) / 2


def _sample(rng, size):
    align = bool(rng.random() < 0.5)
    padding_mode = ("zeros", "border", "reflection")[int(rng.integers(0, 3))]
    if size == "tiny":
        x_shape, kind, hidden, w2 = (2, 1, 3, 3), "mlp", 2, 0.01
    else:
        x_shape, kind, hidden, w2 = (2, 2, 12, 12), "conv", 6, 0.002
    x = rng.standard_normal(x_shape)
    h, w = x_shape[2:]
    for _ in range(100):
        p = {}
        d = int(np.prod(x_shape[1:]))
        if kind == "conv":
            p.update({"localization.0.weight": 0.3 * rng.standard_normal((3, x_shape[1], 3, 3)),
                      "localization.0.bias": 0.1 * rng.standard_normal(3),
                      "localization.3.weight": 0.3 * rng.standard_normal((4, 3, 2, 2)),
                      "localization.3.bias": 0.1 * rng.standard_normal(4)})
            d = 4 * 2 * 2
        p.update(_fc_params(rng, d, hidden, w2))
        # A near-identity map whose translation puts every source coordinate a quarter pixel off the
        # integers (the identity grid samples pixel centres): u = j + t (L or L-1)/2.
        fx, fy = (rng.integers(-1, 2) + rng.choice([0.25, 0.75]) for _ in range(2))
        tx, ty = (2 * f / ((L - 1) if align else L) for f, L in ((fx, w), (fy, h)))
        p["fc_loc.2.bias"] = np.array([1 + rng.uniform(-0.01, 0.01), rng.uniform(-0.005, 0.005), tx,
                                       rng.uniform(-0.005, 0.005), 1 + rng.uniform(-0.01, 0.01), ty])
        theta, lc = localization_forward(x, p, kind=kind)
        u, v = _coords(theta, x_shape, (h, w), align)
        c = np.concatenate([u.reshape(-1), v.reshape(-1)])
        # kinks: integers (corner set, clip at 0 and L-1) and half-integers (reflection mirrors)
        if np.min(np.abs(2 * c - np.round(2 * c))) / 2 > 0.05 and np.min(np.abs(lc["a1"])) > 0.05:
            break
    else:  # pragma: no cover - the construction above almost always succeeds first time
        raise RuntimeError("spatial_transformer sampler found no kink-free draw")
    cfg = {"localization": kind, "padding_mode": padding_mode, "align_corners": align}
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _reference(x, params, localization="conv", size=None, mode="bilinear", padding_mode="zeros",
               align_corners=False, pool_size=2):
    # theta from the localisation net, then the paper's bilinear kernel summed over every input
    # pixel (eq. 5), with the coordinates padded as grid_sample does.
    from ..nn.sampling import grid_coordinates

    theta, _ = localization_forward(x, params, kind=localization, pool_size=pool_size)
    out = size or x.shape[2:]
    grid = affine_grid_apply(theta, out, align_corners)
    h, w = x.shape[2:]
    u, _ = grid_coordinates(grid[..., 0], w, padding_mode, align_corners)
    v, _ = grid_coordinates(grid[..., 1], h, padding_mode, align_corners)
    m, n = np.arange(w), np.arange(h)
    ku = np.maximum(0.0, 1 - np.abs(u[..., None] - m))    # (B, Ho, Wo, W)
    kv = np.maximum(0.0, 1 - np.abs(v[..., None] - n))    # (B, Ho, Wo, H)
    return np.einsum("bchw,bijw,bijh->bcij", x, ku, kv)


def _check_identity_theta_is_identity(rng):
    # fc_loc.2 initialised as the tutorial (weight 0, bias = identity): V = U for every padding mode.
    x = rng.standard_normal((2, 2, 12, 12))
    p = {"localization.0.weight": rng.standard_normal((3, 2, 3, 3)), "localization.0.bias": rng.standard_normal(3),
         "localization.3.weight": rng.standard_normal((4, 3, 2, 2)), "localization.3.bias": rng.standard_normal(4)}
    p.update(_fc_params(rng, 16, 5))
    p["fc_loc.2.weight"] = np.zeros((5, 6))
    p["fc_loc.2.bias"] = np.array([1.0, 0, 0, 0, 1.0, 0])
    err = 0.0
    for align in (False, True):
        for pad in ("zeros", "border", "reflection"):
            v = spatial_transformer(x, p, padding_mode=pad, align_corners=align)
            err = max(err, float(np.abs(v - x).max()))
    assert err < 1e-12, f"identity theta does not reproduce the input (err {err})"
    return err


def _check_custom_localization_pair(rng):
    # A user pair theta = fixed affine map + U-independent parameter: same result and gradients
    # as the built-in MLP with zero first-layer weights.
    s = _sample(rng, "tiny")
    p = dict(s.params)
    p["fc_loc.0.weight"] = np.zeros_like(p["fc_loc.0.weight"])
    t = (p["fc_loc.2.weight"].T @ relu(p["fc_loc.0.bias"]) + p["fc_loc.2.bias"]).reshape(2, 3)

    def fwd(x, params):
        return np.broadcast_to(params["t"], (x.shape[0], 2, 3)).copy(), x.shape

    def bwd(dtheta, shape):
        return {"x": np.zeros(shape), "t": dtheta.sum(axis=0)}

    cfg = dict(s.config)
    v1, c1 = spatial_transformer_forward(s.inputs["x"], p, **cfg)
    v2, c2 = spatial_transformer_forward(s.inputs["x"], {"localization.t": t}, **dict(cfg, localization=(fwd, bwd)))
    g = rng.standard_normal(v1.shape)
    g1, g2 = spatial_transformer_backward(g, c1), spatial_transformer_backward(g, c2)
    dt_ref = g1["fc_loc.2.bias"].reshape(2, 3)
    err = max(float(np.abs(v1 - v2).max()), float(np.abs(g1["x"] - g2["x"]).max()),
              float(np.abs(dt_ref - g2["localization.t"]).max()))
    assert err < 1e-12, f"a custom localization pair disagrees with the built-in MLP (err {err})"
    return err


register(
    Mechanism(
        slug="spatial_transformer_bilinear_sampler", family="5-building-blocks", tier="T2",
        official_code="none by the authors; reference form: pytorch/tutorials intermediate_source/spatial_transformer_tutorial.py@0023ff0",
        title="Spatial transformer: localisation net -> F.affine_grid -> F.grid_sample (bilinear), align_corners/padding",
        paper="Jaderberg, Simonyan, Zisserman, Kavukcuoglu, Spatial Transformer Networks, NeurIPS 2015, "
              "arXiv 1506.02025",
        forward=spatial_transformer_forward, backward=spatial_transformer_backward, sample=_sample,
        reference=_reference, docs="blocks/vision-token-mixers.md#spatial-transformer-bilinear-sampler",
        checks={"identity_theta_is_identity": _check_identity_theta_is_identity,
                "custom_localization_pair": _check_custom_localization_pair},
        notes="not differentiable at integer/half-integer source coordinates, ReLU zeros and max-pool ties: the "
              "sampler keeps every one of them at a distance",
    ),
)
