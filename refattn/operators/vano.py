r"""VANO: variational autoencoding neural operator (Gaussian encoder, function decoder, ELBO).

Paper: Seidman, Kissas, Pappas, Perdikaris, "Variational Autoencoding Neural Operators", ICML 2023,
arXiv 2302.10351. Upstream (JAX/Flax): PredictiveIntelligenceLab/VANO @
51a8ca44635171988fb4baea5ade89ddf00ec9cf ``grf_1d/archs.py`` (``GaussianMLP``, ``MlpEncoder``,
``LinearDecoder``, ``ConcatDecoder``, ``MLP``, ``periodic_encoding``) and ``grf_1d/models.py``
(``NeuralOperator``, ``VAE.kl_loss``, ``VAE.recon_loss``, ``VAE.loss``).

Which part of the model
-----------------------
VANO is the variational autoencoder itself: an encoder from the discretised input function to a
diagonal Gaussian over a latent vector, a reparameterised sample, and a decoder that is a
*function* of the query point (so the reconstruction can be queried anywhere). The record is the
per-example training objective (the negative ELBO for one Monte-Carlo sample) whose parameter
gradient trains the model; :func:`vano_reconstruct` is the decoded function alone. The
convolutional encoder of the 2-D benchmarks (``ConvEncoder``) and the hash-grid decoder
(``MrhDecoder``) are not implemented; the MLP encoder and the linear and concatenation decoders
of the paper's Section 4 are.

Forward
-------
Input $u_b\in\mathbb R^{n}$ (the function on a fixed sensor grid), queries $y_{bj}\in\mathbb R^{d}$
with targets $s_{bj}\in\mathbb R^{c}$, noise $\varepsilon_b\in\mathbb R^{k}$ (held fixed).

* Encoder (``GaussianMLP``): $h = \mathrm{MLP}_{GELU}(u)$, $\mu = hW_\mu + b_\mu$,
  $\ell = hW_\ell + b_\ell$ (upstream's ``logsigma`` is a log-*variance*),
  $z = \mu + \varepsilon\odot\sqrt{e^{\ell}}$, $\mathrm{KL}_b = \tfrac12\sum_k(e^{\ell_k} + \mu_k^2 - 1 - \ell_k)$.
* Periodic encoding $\gamma(y) = [\cos(2\pi y/P), \sin(2\pi y/P)]$.
* Linear decoder: $D(z)(y) = \sum_k z_k\,\phi_k(\gamma(y))$ with $\phi$ an MLP to $k$ outputs
  (one output channel); concatenation decoder: $D(z)(y) = \mathrm{MLP}([z, \gamma(\tilde y)])$ with
  $\tilde y$ the query tiled $k/2$ times (upstream's ``jnp.tile``), $c$ output channels.
* Objective per example: $L_b = \beta\,\mathrm{KL}_b + \frac{1}{n_qc}\sum_{j,c}\tfrac12 w_{bjc}
  (s_{bjc} - D(z_b)(y_{bj})_c)^2$; upstream's loss is $\mathrm{mean}_b L_b$ for one noise sample.

Backward
--------
With $\bar L_b$ the output gradient: $\bar D = -\bar L_b w(s - D)/(n_qc)$, $\bar s = -\bar D$;
linear decoder $\bar z_k = \sum_j\bar D_j\phi_k(y_j)$, $\bar\phi_{jk} = \bar D_jz_k$; concatenation
decoder: the MLP VJP splits into $\bar z$ and $\bar\gamma$. The reparameterisation with the noise
held fixed: $\bar\mu = \bar z + \beta\bar L_b\mu$,
$\bar\ell = \tfrac12\bar z\odot\varepsilon\odot e^{\ell/2} + \tfrac12\beta\bar L_b(e^{\ell} - 1)$;
then the encoder MLP's VJP (GELU, tanh form, as Flax's ``nn.gelu``). The periodic encoding gives
$\bar y = \tfrac{2\pi}{P}(\cos(a)\,\bar\gamma_{\sin} - \sin(a)\,\bar\gamma_{\cos})$, summed over the
tiles.

Conventions made explicit
-------------------------
* Parameter names are the Flax tree flattened with dots: ``encoder.GaussianMLP_0.Dense_{i}.kernel``
  / ``.bias`` (hidden layers, then $\mu$, then $\ell$), ``decoder.MLP_0.Dense_{i}.*``; Flax kernels
  are already ``(in, out)``.
* ``approximate="tanh"``: Flax's ``nn.gelu`` default; ``"none"`` for the exact GELU.
* ``kl_weight`` $\beta$ (upstream ``config.beta``, 5e-6 in ``grf_1d``), ``period`` $P$ (1.0).
* ``weights`` $w$ (upstream's per-point loss weights; default 1).

Measured agreement: no JAX in the reference environment, so upstream's functions were transcribed
line by line into a float64 PyTorch scratch script (autograd): loss <= 4.2e-16 relative, every
gradient (inputs, queries, targets, all parameters) <= 1.7e-15 relative and <= 4.5e-15 absolute,
both decoders, 1-D and 2-D queries (docs page).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..registry import Mechanism, Sample, register

__all__ = ["vano_forward", "vano_backward", "vano", "vano_reconstruct", "vano_init_params"]

_ENC, _DEC = "encoder.GaussianMLP_0.Dense_{}", "decoder.MLP_0.Dense_{}"


def _lin(p, fmt, i, x):
    pre = fmt.format(i)
    return x @ p[f"{pre}.kernel"] + p[f"{pre}.bias"]


def _lin_back(grads, p, fmt, i, dy, x):
    pre = fmt.format(i)
    grads[f"{pre}.kernel"] = grads.get(f"{pre}.kernel", 0) + x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
    grads[f"{pre}.bias"] = grads.get(f"{pre}.bias", 0) + dy.reshape(-1, dy.shape[-1]).sum(0)
    return dy @ p[f"{pre}.kernel"].T


def _mlp(p, fmt, n_hidden, x, approx, first=0):
    acts = []
    for i in range(first, first + n_hidden):
        a = _lin(p, fmt, i, x)
        acts.append((x, a))
        x = gelu(a, approx)
    return x, acts


def _mlp_back(grads, p, fmt, dx, acts, approx, first=0):
    for i in reversed(range(len(acts))):
        x, a = acts[i]
        dx = _lin_back(grads, p, fmt, first + i, dx * gelu_grad(a, approx), x)
    return dx


def _count(params, fmt):
    n = 0
    while isinstance(params, dict) and f"{fmt.format(n)}.kernel" in params:
        n += 1
    return n


def _kernel(params, fmt, i):
    a = params.get(f"{fmt.format(i)}.kernel")
    if a is None or np.ndim(a) != 2:
        raise ValueError(f"params must contain {fmt.format(i)}.kernel as a 2-d (in, out) kernel")
    return np.shape(a)


def _validate(u, y, params, noise, decoder, period):
    u = as_float(u, "u", ndim=2)
    y = as_float(y, "y", ndim=3)
    b, n = u.shape
    if y.shape[0] != b:
        raise ValueError(f"y must have shape (B={b}, n_q, d); got {y.shape}")
    d = y.shape[2]
    check_choice(decoder, "decoder", ("linear", "concat"))
    period = check_positive(period, "period")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict; got {type(params).__name__}")
    ne, nd = _count(params, _ENC), _count(params, _DEC)
    if ne < 2 or nd < 1:
        raise ValueError(f"params must hold the encoder's {_ENC.format('i')} (hidden layers, mu, logsigma) and the "
                         f"decoder's {_DEC.format('i')} kernels and biases")
    widths = [_kernel(params, _ENC, i) for i in range(ne)] + [_kernel(params, _DEC, i) for i in range(nd)]
    k = widths[ne - 1][1]
    spec, w_in = {}, n
    for i in range(ne - 2):
        spec.update({f"{_ENC.format(i)}.kernel": (w_in, widths[i][1]), f"{_ENC.format(i)}.bias": (widths[i][1],)})
        w_in = widths[i][1]
    for i in (ne - 2, ne - 1):
        spec.update({f"{_ENC.format(i)}.kernel": (w_in, k), f"{_ENC.format(i)}.bias": (k,)})
    if decoder == "concat" and k % 2:
        raise ValueError(f"the concat decoder tiles the query k/2 times: latent size k={k} must be even")
    w_in = 2 * d if decoder == "linear" else k + k * d
    for i in range(nd):
        w_out = widths[ne + i][1]
        spec.update({f"{_DEC.format(i)}.kernel": (w_in, w_out), f"{_DEC.format(i)}.bias": (w_out,)})
        w_in = w_out
    if decoder == "linear" and w_in != k:
        raise ValueError(f"the linear decoder's MLP must output the latent size k={k}; got {w_in}")
    p = check_params(params, spec)
    noise = as_float(noise, "noise", ndim=2)
    if noise.shape != (b, k):
        raise ValueError(f"noise must have shape (B={b}, k={k}); got {noise.shape}")
    return u, y, p, noise, ne, nd, k, period


def _encode_decode(u, y, p, noise, ne, nd, k, decoder, period, approx):
    h, enc_acts = _mlp(p, _ENC, ne - 2, u, approx)
    mu, ls = _lin(p, _ENC, ne - 2, h), _lin(p, _ENC, ne - 1, h)
    std = np.exp(0.5 * ls)
    z = mu + noise * std
    yy = y if decoder == "linear" else np.tile(y, (1, 1, k // 2))
    a = 2 * np.pi * yy / period
    enc = np.concatenate([np.cos(a), np.sin(a)], axis=-1)
    if decoder == "linear":
        x_in = enc
    else:
        x_in = np.concatenate([np.broadcast_to(z[:, None], (z.shape[0], y.shape[1], k)), enc], axis=-1)
    hd, dec_acts = _mlp(p, _DEC, nd - 1, x_in, approx)
    phi = _lin(p, _DEC, nd - 1, hd)
    out = np.sum(z[:, None] * phi, axis=-1, keepdims=True) if decoder == "linear" else phi
    c = {"u": u, "h": h, "enc_acts": enc_acts, "mu": mu, "ls": ls, "std": std, "z": z, "noise": noise, "a": a,
         "x_in": x_in, "hd": hd, "dec_acts": dec_acts, "phi": phi}
    return out, c


def vano_forward(u, y, s, params, *, noise, decoder: str = "linear", kl_weight: float = 5e-6,
                 period: float = 1.0, weights=None, approximate: str = "tanh"):
    r"""Per-example VANO objective $L_b = \beta\,\mathrm{KL}_b + \mathrm{mean}\,\tfrac12w(s - D(z_b)(y))^2$.

    Parameters
    ----------
    u : array (B, n)
        Input functions on the encoder's sensor grid.
    y : array (B, n_q, d)
        Query points.
    s : array (B, n_q, c)
        Target values at the queries ($c = 1$ for the linear decoder).
    params : dict
        ``encoder.GaussianMLP_0.Dense_{i}.{kernel,bias}`` (hidden layers, then $\mu$, then
        $\log\sigma^2$) and ``decoder.MLP_0.Dense_{i}.{kernel,bias}``; kernels ``(in, out)``.
    noise : array (B, k)
        $\varepsilon$ of the reparameterised sample, held fixed.
    decoder : {"linear", "concat"}
        Upstream ``LinearDecoder`` or ``ConcatDecoder`` (periodic encoding).
    kl_weight, period, weights, approximate
        $\beta$ (5e-6), the encoding period (1.0), per-point loss weights (broadcastable to ``s``),
        the GELU form (``"tanh"``, Flax's default).

    Returns
    -------
    loss (B,), cache
    """
    check_choice(approximate, "approximate", ("tanh", "none"))
    kl_weight = check_positive(kl_weight, "kl_weight", allow_zero=True)
    u, y, p, noise, ne, nd, k, period = _validate(u, y, params, noise, decoder, period)
    s = as_float(s, "s", ndim=3)
    c_out = 1 if decoder == "linear" else np.shape(p[f"{_DEC.format(nd - 1)}.kernel"])[1]
    if s.shape != y.shape[:2] + (c_out,):
        raise ValueError(f"s must have shape {y.shape[:2] + (c_out,)} (targets at the queries); got {s.shape}")
    w = np.ones(1) if weights is None else as_float(weights, "weights")
    try:
        np.broadcast_shapes(w.shape, s.shape)
    except ValueError:
        raise ValueError(f"weights must broadcast to s {s.shape}; got {w.shape}") from None
    dt = compute_dtype(u, y, s, *p.values())
    u, y, s, p = u.astype(dt, copy=False), y.astype(dt, copy=False), s.astype(dt, copy=False), cast_all(dt, p)
    noise, w = noise.astype(dt, copy=False), w.astype(dt, copy=False)
    out, c = _encode_decode(u, y, p, noise, ne, nd, k, decoder, period, approximate)
    r = s - out
    kl = 0.5 * np.sum(c["std"] ** 2 + c["mu"] ** 2 - 1.0 - c["ls"], axis=-1)
    scale = 1.0 / (s.shape[1] * s.shape[2])
    loss = kl_weight * kl + scale * np.sum(0.5 * w * r * r, axis=(1, 2))
    c.update(p=p, r=r, w=w, scale=scale, kw=kl_weight, decoder=decoder, period=period, approx=approximate,
             ne=ne, nd=nd, k=k, y=y, dt=dt, out_shape=loss.shape)
    return loss, c


def vano_backward(dout, cache):
    """Gradients of :func:`vano_forward`: ``u``, ``y``, ``s`` and every params key (noise held fixed)."""
    p, dt, approx = cache["p"], cache["dt"], cache["approx"]
    g = as_dout(dout, cache["out_shape"], dt)
    ne, nd, k, z = cache["ne"], cache["nd"], cache["k"], cache["z"]
    grads = {}
    dres = g[:, None, None] * cache["scale"] * cache["w"] * cache["r"]          # dL/ds
    dout_fn = -dres
    if cache["decoder"] == "linear":
        dz = np.sum(dout_fn * cache["phi"], axis=1)
        dphi = dout_fn * z[:, None]
    else:
        dz, dphi = 0.0, dout_fn
    dhd = _lin_back(grads, p, _DEC, nd - 1, dphi, cache["hd"])
    dx_in = _mlp_back(grads, p, _DEC, dhd, cache["dec_acts"], approx)
    if cache["decoder"] == "linear":
        denc = dx_in
    else:
        dz = dz + dx_in[..., :k].sum(axis=1)
        denc = dx_in[..., k:]
    a = cache["a"]
    h2 = a.shape[-1]
    da = (np.cos(a) * denc[..., h2:] - np.sin(a) * denc[..., :h2]) * (2 * np.pi / cache["period"])
    y = cache["y"]
    dy = da.reshape(y.shape[:2] + (-1, y.shape[2])).sum(axis=2) if cache["decoder"] == "concat" else da
    mu, std = cache["mu"], cache["std"]
    kw = cache["kw"] * g[:, None]
    dmu = dz + kw * mu
    dls = 0.5 * dz * cache["noise"] * std + 0.5 * kw * (std ** 2 - 1.0)
    dh = _lin_back(grads, p, _ENC, ne - 2, dmu, cache["h"]) + _lin_back(grads, p, _ENC, ne - 1, dls, cache["h"])
    grads["u"] = _mlp_back(grads, p, _ENC, dh, cache["enc_acts"], approx)
    grads["y"] = dy
    grads["s"] = dres
    return {key: np.asarray(v, dtype=dt) for key, v in grads.items()}


def vano(u, y, s, params, **config):
    """Convenience wrapper: the per-example objective of :func:`vano_forward`."""
    return vano_forward(u, y, s, params, **config)[0]


def vano_reconstruct(u, y, params, *, noise, decoder: str = "linear", period: float = 1.0,
                     approximate: str = "tanh"):
    """The decoded function $D(z)(y)$ (B, n_q, c) for the sample $z = \\mu + \\varepsilon\\,e^{\\ell/2}$
    (upstream ``NeuralOperator.__call__``); ``noise`` zeros give the posterior mean."""
    check_choice(approximate, "approximate", ("tanh", "none"))
    u, y, p, noise, ne, nd, k, period = _validate(u, y, params, noise, decoder, period)
    dt = compute_dtype(u, y, *p.values())
    p = cast_all(dt, p)
    return _encode_decode(u.astype(dt), y.astype(dt), p, noise.astype(dt), ne, nd, k, decoder, period, approximate)[0]


def vano_init_params(rng, n_sensors: int, latent_dim: int, query_dim: int = 1, *, decoder: str = "linear",
                     enc_layers: int = 3, enc_hidden: int = 128, dec_layers: int = 3, dec_hidden: int = 128,
                     out_channels: int = 1, dtype=np.float64) -> dict:
    """Parameters under the Flax names, LeCun-normal kernels and zero biases (Flax ``Dense``
    defaults); defaults are ``grf_1d/configs/default.py`` (3 x 128 encoder and decoder)."""
    check_choice(decoder, "decoder", ("linear", "concat"))
    n_sensors, latent_dim = check_int(n_sensors, "n_sensors", minimum=1), check_int(latent_dim, "latent_dim", minimum=1)

    def dense(fmt, i, n_in, n_out):
        return {f"{fmt.format(i)}.kernel": rng.standard_normal((n_in, n_out)) / np.sqrt(n_in),
                f"{fmt.format(i)}.bias": np.zeros(n_out)}

    p, w = {}, n_sensors
    for i in range(enc_layers):
        p.update(dense(_ENC, i, w, enc_hidden))
        w = enc_hidden
    p.update(dense(_ENC, enc_layers, w, latent_dim))
    p.update(dense(_ENC, enc_layers + 1, w, latent_dim))
    w = 2 * query_dim if decoder == "linear" else latent_dim + latent_dim * query_dim
    for i in range(dec_layers):
        p.update(dense(_DEC, i, w, dec_hidden))
        w = dec_hidden
    p.update(dense(_DEC, dec_layers, w, latent_dim if decoder == "linear" else out_channels))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, decoder="linear"):
    if size == "tiny":
        b, n, nq, k, kw = 2, 3, 2, 2, dict(enc_layers=1, enc_hidden=2, dec_layers=1, dec_hidden=2)
    else:
        b, n, nq, k, kw = 2, 6, 5, 4, dict(enc_layers=2, enc_hidden=5, dec_layers=2, dec_hidden=4)
    c = 1 if decoder == "linear" else 2
    p = vano_init_params(rng, n, k, 1, decoder=decoder, out_channels=c, **kw)
    p = {key: v + 0.3 * rng.standard_normal(v.shape) for key, v in p.items()}
    return Sample(inputs={"u": rng.standard_normal((b, n)), "y": rng.random((b, nq, 1)),
                          "s": rng.standard_normal((b, nq, c))},
                  params=p, config={"noise": rng.standard_normal((b, k)), "decoder": decoder, "kl_weight": 0.3,
                                    "weights": 0.5 + rng.random((b, nq, c))})


def _check_concat_and_exact_gelu_fd(rng):
    from ..testing.gradcheck import gradcheck
    s = _sample(rng, "tiny", decoder="concat")
    worst = gradcheck(vano_forward, vano_backward, s).max_rel
    s = _sample(rng, "tiny")
    s.config.update(approximate="none", weights=None)
    return max(worst, gradcheck(vano_forward, vano_backward, s).max_rel)


def _check_kl_closed_form(rng):
    # KL term against the Monte-Carlo-free closed form of KL(N(mu, diag e^l) || N(0, I)) computed
    # from torch-free densities: E_q[log q - log p] by Gauss-Hermite quadrature per coordinate.
    s = _sample(rng, "small")
    _, c = vano_forward(**s.inputs, params=s.params, **dict(s.config, kl_weight=1.0))
    xs, ws = np.polynomial.hermite_e.hermegauss(60)
    mu, sd = c["mu"], c["std"]
    zq = mu[..., None] + sd[..., None] * xs
    logq = -0.5 * ((zq - mu[..., None]) / sd[..., None]) ** 2 - np.log(sd[..., None])
    logp = -0.5 * zq ** 2
    kl_quad = np.sum(np.sum(ws * (logq - logp), axis=-1) / np.sqrt(2 * np.pi), axis=-1)
    kl = 0.5 * np.sum(sd ** 2 + mu ** 2 - 1.0 - c["ls"], axis=-1)
    err = float(np.abs(kl - kl_quad).max())
    assert err < 1e-10, f"KL term differs from the Gaussian KL divergence: {err}"
    return err


def _check_discretisation_of_queries(rng):
    # The decoder is a function of the query point: decoding on two different query sets agrees on
    # the shared points, whatever the other points are.
    s = _sample(rng, "small")
    cfg = {k: v for k, v in s.config.items() if k in ("noise", "decoder")}
    full = vano_reconstruct(s.inputs["u"], s.inputs["y"], s.params, **cfg)
    part = vano_reconstruct(s.inputs["u"], s.inputs["y"][:, 1:3], s.params, **cfg)
    err = float(np.abs(full[:, 1:3] - part).max())
    assert err < 1e-12, f"a query's value depends on the other queries: {err}"
    return err


register(
    Mechanism(
        slug="vano_variational_autoencoding_operator", family="3-operator", tier="T3",
        title="VANO: Gaussian encoder, reparameterised latent, function decoder, per-example ELBO",
        paper="Seidman, Kissas, Pappas, Perdikaris, Variational Autoencoding Neural Operators, ICML 2023, "
              "arXiv 2302.10351",
        official_code="PredictiveIntelligenceLab/VANO",
        forward=vano_forward, backward=vano_backward, sample=_sample,
        docs="operators/o5c.md#vano-gaussian-encoder-function-decoder-and-the-elbo",
        checks={"concat_decoder_and_exact_gelu_gradcheck": _check_concat_and_exact_gelu_fd,
                "kl_term_is_gaussian_kl": _check_kl_closed_form,
                "decoder_pointwise_in_queries": _check_discretisation_of_queries},
    ),
)
