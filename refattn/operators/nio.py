r"""NIO: Neural Inverse Operator, a DeepONet over operator samples averaged into an FNO.

Paper: Molinaro, Yang, Engquist, Mishra, "Neural Inverse Operators for Solving PDE Inverse
Problems", ICML 2023, arXiv 2301.11167. Upstream: mroberto166/nio @
c2defcc983a89dab8470561a0122247a04063fb5 ``NIOModules.py`` (``NIOHelmPermInv``, ``NIOHeartPerm``:
the 2-D permutation-invariant NIOs), ``DeepONetModules.py`` (``FeedForwardNN``,
``DeepOnetNoBiasOrg``, ``activation``), ``FNOModules.py`` (``FNO_WOR``, ``SpectralConv2d``).

Which part of the model
-----------------------
An inverse problem maps an *operator* (e.g. a Dirichlet-to-Neumann map, observed through $L$
input/output samples) to a coefficient field. NIO encodes each of the $L$ samples with a branch
network (a problem-specific CNN in upstream's ``Baselines.py``: ``EncoderHelm2``,
``EncoderRad2``, ``EncoderInversionNet``), turns each into a function on the grid with a DeepONet,
averages the $L$ functions (the permutation-invariant, sample-count-independent step that makes it
an operator-to-function map) and maps the average to the coefficient with an FNO. This module is
that composition after the branch encoder: it takes the branch coefficients $\beta$ and returns the
coefficient field; the gradient with respect to $\beta$ continues into any encoder.

Forward
-------
Grid points $y\in\mathbb R^{n_x\times n_y\times 2}$, branch coefficients $\beta\in\mathbb R^{B\times L\times p}$.

1. Trunk (``FeedForwardNN``): $t = \phi(yA_0 + a_0)$, then $t\leftarrow\mathrm{BN}_k(\phi(tA_k + a_k))$
   for the hidden layers ($\mathrm{BN}$ in eval mode: $\gamma(t-\mu)/\sqrt{\sigma^2+\epsilon} + \delta$
   with the running statistics), $T = tA_{out} + a_{out}\in\mathbb R^{n_xn_y\times p}$; $\phi$ = leaky
   ReLU (slope 0.01).
2. DeepONet per sample: $D_{bl}(y) = (\beta_{bl}\cdot T(y) + b_0)/\sqrt p$.
3. Mean over the samples and lifting (upstream ``fc0`` with its sample column divided by $L$):
   $h(y) = W_{0}^{(y)}y + W_0^{(D)}\,\tfrac1L\sum_l D_{bl}(y) + c_0\in\mathbb R^{w}$.
4. ``FNO_WOR``: zero-pad the two grid axes at the end by $\mathrm{round}(n\cdot$``padding_frac``$)$,
   ``n_layers`` of $h\leftarrow\mathcal K_kh + C_kh + c_k$ (spectral convolution with two kept
   corners, 1x1 convolution; GELU between layers, not after the last), crop, then
   $\mathrm{fc2}(\mathrm{GELU}(\mathrm{fc1}(h)))$, channel 0.

Backward
--------
Reverse mode: the FNO head (linear and GELU VJPs), the spectral convolution
(``fno_spectral_conv_backward``) and the 1x1 convolution per layer, the padding's adjoint (crop of
the gradient), then $\bar m = \bar h\,W_0^{(D)\top}$, $\bar D_{bl} = \bar m/L$,
$\bar\beta_{bl} = \bar D_{bl}T/\sqrt p$, $\bar T = \sum_{b,l}\bar D_{bl}^\top\beta_{bl}/\sqrt p$,
$\bar b_0 = \sum\bar D/\sqrt p$, and the trunk MLP's VJP (eval-mode BatchNorm is an affine map:
$\bar t = \bar u\,\gamma/\sqrt{\sigma^2+\epsilon}$, $\bar\gamma = \sum\bar u\,\hat t$, $\bar\delta = \sum\bar u$).

Conventions made explicit
-------------------------
* Training-time randomness is outside the layer: upstream draws a random subset of the $L$ samples
  in ``train()`` mode and uses dropout 0; the layer is the ``eval()`` forward (all samples), and the
  trunk's BatchNorm uses the running statistics ``trunk_running_stats`` (fresh modules: 0 and 1).
* ``fc0`` enters upstream through ``self.fc0.weight.data``: autograd never reaches it, so upstream
  never trains ``fc0``. refattn returns its true gradient (the layer depends on it).
* Upstream crops ``x[..., :-x1_padding, :-x2_padding]`` with the two paddings swapped relative to
  ``F.pad`` (equal on square grids, the only ones upstream uses); refattn crops what it padded.
* ``modes``: taken from the weight shapes (upstream halves ``modes2`` when ``modes > 35``).
* Parameter names are upstream's state-dict names (``trunk.*``, ``deeponet.b0``, ``fc0.*``,
  ``fno.*``); ``deeponet.b0`` (0-d in torch) is stored as shape (1,); linear weights
  ``(in, out)``, the 1x1 convolutions keep torch's ``(out, in, 1, 1)``,
  complex spectral weights are ``weights{1,2}_real`` / ``_imag``.

Measured agreement with the upstream module (``NIOHelmPermInv`` in eval mode with the branch
replaced by the identity; float64, CPU, upstream's hard-coded complex64 spectral buffer switched to
the input's dtype; docs page): output <= 1.2e-15 absolute, every gradient (branch coefficients and
all parameters but ``fc0``, which upstream detaches) <= 8.7e-15 absolute and <= 4.8e-15 relative.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .fno import fno_spectral_conv_backward, fno_spectral_conv_forward, init_fno_params

__all__ = ["nio_forward", "nio_backward", "nio", "nio_init_params"]

_BN_EPS = 1e-5
_SLOPE = 0.01
_ACTS = {"leaky_relu": (lambda x: np.where(x > 0, x, _SLOPE * x), lambda x: np.where(x > 0, 1.0, _SLOPE)),
         "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2)}


def _count(params, fmt):
    n = 0
    while fmt.format(n) in params:
        n += 1
    return n


def _w2(params, key):
    a = params.get(key) if isinstance(params, dict) else None
    if a is None or np.ndim(a) != 2:
        raise ValueError(f"params must contain {key!r} as a 2-d weight")
    return np.shape(a)


def nio_forward(beta, params, *, grid, padding_frac: float = 0.25, activation: str = "leaky_relu",
                trunk_running_stats=None):
    r"""NIO after the branch encoder (``NIOHelmPermInv.forward`` in eval mode; module docstring).

    Parameters
    ----------
    beta : array (B, L, p)
        Branch coefficients of the $L$ operator samples (upstream ``self.branch(x)``).
    params : dict
        ``trunk.input_layer.*`` (2, n), ``trunk.hidden_layers.{k}.*`` (n, n),
        ``trunk.batch_layers.{k}.{weight,bias}`` (n,), ``trunk.output_layer.*`` (n, p);
        ``deeponet.b0`` (1,) (torch's 0-d parameter as a 1-vector); ``fc0.*`` (3, w); per FNO
        layer ``fno.conv_list.{k}.weight`` (w, w, 1, 1),
        ``fno.conv_list.{k}.bias`` (w,), ``fno.spectral_list.{k}.weights{1,2}_{real,imag}``
        (w, w, m1, m2); ``fno.fc1.*`` (w, f), ``fno.fc2.*`` (f, 1).
    grid : array (n_x, n_y, 2)
        The output grid (upstream ``grid``); not differentiated.
    padding_frac : float
        Zero padding of ``FNO_WOR`` (upstream 1/4).
    activation : {"leaky_relu", "tanh"}
        The trunk's ``act_string`` (upstream ``leaky_relu``).
    trunk_running_stats : dict, optional
        ``trunk.batch_layers.{k}.running_mean`` / ``running_var`` buffers (default 0 and 1).

    Returns
    -------
    out (B, n_x, n_y), cache
    """
    beta = as_float(beta, "beta", ndim=3)
    grid = as_float(grid, "grid", ndim=3)
    if grid.shape[2] != 2:
        raise ValueError(f"grid must have shape (n_x, n_y, 2); got {grid.shape}")
    check_choice(activation, "activation", tuple(_ACTS))
    padding_frac = float(padding_frac)
    if not 0.0 <= padding_frac <= 4.0:
        raise ValueError(f"padding_frac must be in [0, 4]; got {padding_frac}")
    nx, ny = grid.shape[:2]
    b, n_l, p_dim = beta.shape
    n_hid = _count(params if isinstance(params, dict) else {}, "trunk.hidden_layers.{}.weight")
    n_fno = _count(params if isinstance(params, dict) else {}, "fno.conv_list.{}.weight")
    neu = _w2(params, "trunk.input_layer.weight")[1]
    width = _w2(params, "fc0.weight")[1]
    f_hid = _w2(params, "fno.fc1.weight")[1]
    spec = {"trunk.input_layer.weight": (2, neu), "trunk.input_layer.bias": (neu,),
            "trunk.output_layer.weight": (neu, p_dim), "trunk.output_layer.bias": (p_dim,),
            "deeponet.b0": (1,), "fc0.weight": (3, width), "fc0.bias": (width,),
            "fno.fc1.weight": (width, f_hid), "fno.fc1.bias": (f_hid,), "fno.fc2.weight": (f_hid, 1),
            "fno.fc2.bias": (1,)}
    for k in range(n_hid):
        spec.update({f"trunk.hidden_layers.{k}.weight": (neu, neu), f"trunk.hidden_layers.{k}.bias": (neu,),
                     f"trunk.batch_layers.{k}.weight": (neu,), f"trunk.batch_layers.{k}.bias": (neu,)})
    pads = (int(round(nx * padding_frac)), int(round(ny * padding_frac)))
    for k in range(n_fno):
        w1 = params.get(f"fno.spectral_list.{k}.weights1_real")
        if w1 is None or np.ndim(w1) != 4:
            raise ValueError(f"params must contain 'fno.spectral_list.{k}.weights1_real' of shape (w, w, m1, m2)")
        m1, m2 = np.shape(w1)[2:]
        if 2 * m1 > nx + pads[0] or m2 > (ny + pads[1]) // 2 + 1:
            raise ValueError(f"spectral modes ({m1}, {m2}) do not fit the padded grid {(nx + pads[0], ny + pads[1])}")
        spec.update({f"fno.conv_list.{k}.weight": (width, width, 1, 1), f"fno.conv_list.{k}.bias": (width,)})
        spec.update({f"fno.spectral_list.{k}.weights{c}_{part}": (width, width, m1, m2)
                     for c in (1, 2) for part in ("real", "imag")})
    p = check_params(params, spec)
    stats = {}
    for k in range(n_hid):
        for name, default in (("running_mean", 0.0), ("running_var", 1.0)):
            key = f"trunk.batch_layers.{k}.{name}"
            val = (trunk_running_stats or {}).get(key, np.full(neu, default))
            val = as_float(val, key, ndim=1)
            if val.shape != (neu,):
                raise ValueError(f"{key} must have shape ({neu},); got {val.shape}")
            stats[key] = val
    dt = compute_dtype(beta, *p.values())
    beta, grid, p = beta.astype(dt, copy=False), grid.astype(dt, copy=False), cast_all(dt, p)
    act, _ = _ACTS[activation]

    y = grid.reshape(-1, 2)
    tc = []
    pre = linear_prefixed(p, "trunk.input_layer", y)
    t = act(pre)
    tc.append((y, pre))
    for k in range(n_hid):
        a = linear_prefixed(p, f"trunk.hidden_layers.{k}", t)
        sa = act(a)
        inv = 1.0 / np.sqrt(stats[f"trunk.batch_layers.{k}.running_var"].astype(dt) + _BN_EPS)
        that = (sa - stats[f"trunk.batch_layers.{k}.running_mean"].astype(dt)) * inv
        tc.append((t, a, that, inv))
        t = that * p[f"trunk.batch_layers.{k}.weight"] + p[f"trunk.batch_layers.{k}.bias"]
    trunk = linear_prefixed(p, "trunk.output_layer", t)                     # (P, p)
    root = float(np.sqrt(p_dim))
    dmean = (beta.mean(axis=1) @ trunk.T + p["deeponet.b0"]) / root        # mean_l D_bl, (B, P)
    feats = np.concatenate([np.broadcast_to(y, (b,) + y.shape), dmean[..., None]], axis=-1)
    h = (feats @ p["fc0.weight"] + p["fc0.bias"]).reshape(b, nx, ny, width)
    h = np.pad(h, ((0, 0), (0, pads[0]), (0, pads[1]), (0, 0)))
    layers = []
    for k in range(n_fno):
        sp = {f"weights{c}_{part}": p[f"fno.spectral_list.{k}.weights{c}_{part}"]
              for c in (1, 2) for part in ("real", "imag")}
        s_out, sc = fno_spectral_conv_forward(h, sp)
        z = s_out + h @ p[f"fno.conv_list.{k}.weight"][:, :, 0, 0].T + p[f"fno.conv_list.{k}.bias"]
        layers.append((h, sc, z))
        h = gelu(z) if k < n_fno - 1 else z
    h = h[:, :nx, :ny]
    a1 = linear_prefixed(p, "fno.fc1", h)
    out = linear_prefixed(p, "fno.fc2", gelu(a1))[..., 0]
    cache = {"p": p, "beta": beta, "trunk": trunk, "tc": tc, "feats": feats, "layers": layers, "h": h,
             "a1": a1, "pads": pads, "act": activation, "n_hid": n_hid, "dt": dt, "out_shape": out.shape}
    return out, cache


def nio_backward(dout, cache):
    """Gradients of :func:`nio_forward`: ``beta`` and every params key."""
    p, dt, beta = cache["p"], cache["dt"], cache["beta"]
    g = as_dout(dout, cache["out_shape"], dt)
    grads = {}
    a1 = cache["a1"]
    dg = linear_prefixed_vjp(grads, p, "fno.fc2", g[..., None], gelu(a1))
    dh = linear_prefixed_vjp(grads, p, "fno.fc1", dg * gelu_grad(a1), cache["h"])
    b, nx, ny, width = dh.shape
    dh = np.pad(dh, ((0, 0), (0, cache["pads"][0]), (0, cache["pads"][1]), (0, 0)))
    layers = cache["layers"]
    for k in reversed(range(len(layers))):
        h, sc, z = layers[k]
        dz = dh * gelu_grad(z) if k < len(layers) - 1 else dh
        grads[f"fno.conv_list.{k}.bias"] = dz.sum(axis=(0, 1, 2))
        wc = p[f"fno.conv_list.{k}.weight"][:, :, 0, 0]
        grads[f"fno.conv_list.{k}.weight"] = np.einsum("bxyo,bxyi->oi", dz, h)[:, :, None, None]
        sg = fno_spectral_conv_backward(dz, sc)
        for key, val in sg.items():
            if key != "x":
                grads[f"fno.spectral_list.{k}.{key}"] = val
        dh = sg["x"] + dz @ wc
    dh = dh[:, :nx, :ny].reshape(b, nx * ny, width)
    feats = cache["feats"]
    grads["fc0.weight"] = np.einsum("bpi,bpo->io", feats, dh)
    grads["fc0.bias"] = dh.sum(axis=(0, 1))
    dmean = dh @ p["fc0.weight"][2]                                        # (B, P)
    trunk, n_l, p_dim = cache["trunk"], beta.shape[1], beta.shape[2]
    root = float(np.sqrt(p_dim))
    grads["deeponet.b0"] = np.full(1, dmean.sum() / root, dtype=dt)
    grads["beta"] = np.broadcast_to(((dmean @ trunk) / (root * n_l))[:, None, :], beta.shape).copy()
    dtrunk = dmean.T @ beta.mean(axis=1) / root
    _, act_grad = _ACTS[cache["act"]]
    act = _ACTS[cache["act"]][0]
    tc = cache["tc"]
    t_last = (tc[-1][2] * p[f"trunk.batch_layers.{cache['n_hid'] - 1}.weight"]
              + p[f"trunk.batch_layers.{cache['n_hid'] - 1}.bias"]) if cache["n_hid"] else act(tc[0][1])
    dt_ = linear_prefixed_vjp(grads, p, "trunk.output_layer", dtrunk, t_last)
    for k in reversed(range(cache["n_hid"])):
        t_in, a, that, inv = tc[k + 1]
        grads[f"trunk.batch_layers.{k}.weight"] = np.sum(dt_ * that, axis=0)
        grads[f"trunk.batch_layers.{k}.bias"] = np.sum(dt_, axis=0)
        da = dt_ * p[f"trunk.batch_layers.{k}.weight"] * inv * act_grad(a)
        dt_ = linear_prefixed_vjp(grads, p, f"trunk.hidden_layers.{k}", da, t_in)
    y, pre = tc[0]
    linear_prefixed_vjp(grads, p, "trunk.input_layer", dt_ * act_grad(pre), y)
    return grads


def nio(beta, params, **config):
    """Convenience wrapper: the output of :func:`nio_forward`."""
    return nio_forward(beta, params, **config)[0]


def nio_init_params(rng, n_basis: int, *, trunk_neurons: int = 256, trunk_hidden_layers: int = 8,
                    width: int = 64, modes=(16, 16), n_layers: int = 1, fc1_width: int = 128,
                    dtype=np.float64) -> dict:
    """Parameters under upstream's names (PyTorch-default linears, FNO ``scale * rand`` spectral
    weights, BatchNorm weight 1 / bias 0, ``b0 = 0``); defaults are ``RunNio.py``'s Helmholtz
    trunk (8 hidden layers of 256) and FNO (width 64, 16 modes, 1 layer)."""
    p = init_linear_prefixed(rng, 2, trunk_neurons, "trunk.input_layer")
    for k in range(trunk_hidden_layers - 1):
        p.update(init_linear_prefixed(rng, trunk_neurons, trunk_neurons, f"trunk.hidden_layers.{k}"))
        p.update({f"trunk.batch_layers.{k}.weight": np.ones(trunk_neurons),
                  f"trunk.batch_layers.{k}.bias": np.zeros(trunk_neurons)})
    p.update(init_linear_prefixed(rng, trunk_neurons, n_basis, "trunk.output_layer"))
    p["deeponet.b0"] = np.zeros(1)
    p.update(init_linear_prefixed(rng, 3, width, "fc0"))
    bound = 1.0 / np.sqrt(width)
    for k in range(n_layers):
        p[f"fno.conv_list.{k}.weight"] = rng.uniform(-bound, bound, (width, width, 1, 1))
        p[f"fno.conv_list.{k}.bias"] = rng.uniform(-bound, bound, width)
        p.update({f"fno.spectral_list.{k}.{key}": v for key, v in init_fno_params(rng, width, width, modes).items()})
    p.update(init_linear_prefixed(rng, width, fc1_width, "fno.fc1"))
    p.update(init_linear_prefixed(rng, fc1_width, 1, "fno.fc2"))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _grid(nx, ny):
    gx, gy = np.meshgrid(np.linspace(0, 1, nx), np.linspace(0, 1, ny), indexing="ij")
    return np.stack([gx, gy], axis=-1)


def _sample(rng, size, activation="tanh"):
    if size == "tiny":
        nx, ny, n_l, pb, kw = 3, 4, 2, 2, dict(trunk_neurons=2, trunk_hidden_layers=2, width=2, modes=(1, 2),
                                              n_layers=2, fc1_width=2)
    else:
        nx, ny, n_l, pb, kw = 6, 6, 3, 3, dict(trunk_neurons=4, trunk_hidden_layers=3, width=3, modes=(2, 2),
                                              n_layers=2, fc1_width=4)
    p = nio_init_params(rng, pb, **kw)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    neu = kw["trunk_neurons"]
    stats = {}
    for k in range(kw["trunk_hidden_layers"] - 1):
        stats[f"trunk.batch_layers.{k}.running_mean"] = 0.1 * rng.standard_normal(neu)
        stats[f"trunk.batch_layers.{k}.running_var"] = 0.5 + rng.random(neu)
    return Sample(inputs={"beta": rng.standard_normal((2, n_l, pb))}, params=p,
                  config={"grid": _grid(nx, ny), "activation": activation, "trunk_running_stats": stats})


def _check_sample_permutation_and_count(rng):
    # The average over the operator samples: permuting them, or repeating every sample, leaves the
    # output unchanged (NIO is a map from the operator, not from an ordered list of samples).
    s = _sample(rng, "small")
    out = nio(**s.inputs, params=s.params, **s.config)
    beta = s.inputs["beta"]
    err = float(np.abs(nio(beta[:, ::-1], s.params, **s.config) - out).max())
    err = max(err, float(np.abs(nio(np.repeat(beta, 2, axis=1), s.params, **s.config) - out).max()))
    assert err < 1e-12, f"output depends on the order or count of repeated samples: {err}"
    return err


def _check_leaky_relu_fd(rng):
    from ..testing.gradcheck import gradcheck
    s = _sample(rng, "tiny", activation="leaky_relu")
    worst = gradcheck(nio_forward, nio_backward, s).max_rel
    s = _sample(rng, "tiny")
    s.config["padding_frac"] = 0.0
    return max(worst, gradcheck(nio_forward, nio_backward, s).max_rel)


register(
    Mechanism(
        slug="nio_neural_inverse_operator", family="3-operator", tier="T3",
        title="NIO: DeepONet over operator samples, sample mean, FNO (after the branch encoder)",
        paper="Molinaro, Yang, Engquist, Mishra, Neural Inverse Operators for Solving PDE Inverse Problems, "
              "ICML 2023, arXiv 2301.11167",
        forward=nio_forward, backward=nio_backward, sample=_sample,
        docs="operators/o5c.md#nio-deeponet-over-operator-samples-sample-mean-fno",
        checks={"sample_permutation_and_count_invariance": _check_sample_permutation_and_count,
                "leaky_relu_and_no_padding_gradcheck": _check_leaky_relu_fd},
    ),
)
