r"""TCNCA: MEGA's moving-average gated attention with the exponential moving average replaced by
a dilated temporal convolutional network, and softmax attention restricted to non-overlapping
chunks (block-diagonal), so the layer costs $O(L)$.

Terzić, Hersche, Karunaratne, Benini, Sebastian, Rahimi, "TCNCA: Temporal Convolution Network
with Chunked Attention for Scalable Sequence Processing", NeurIPS 2023 ENLSP workshop, arXiv
2312.05605. No code is published (the paper's body was not reachable here; its abstract states
the construction). The gated-attention layer is MEGA's, read at
``facebookresearch/mega fairseq/modules/moving_average_gated_attention.py``
(``MovingAverageGatedAttention``), ``fairseq/modules/relative_positional_bias.py``
(``SimpleRelativePositionalBias``) and ``fairseq/modules/exponential_moving_average.py``
(the ``F.silu(EMA(x) + omega * x)`` wrapper the TCN slots into)
@aeaa4b44592cd1d60a9a34554e359eda2a62b03b, with upstream's parameter names (linear weights
stored ``(in, out)`` = torch ``weight.T``).

Forward
-------
For $x\in\mathbb R^{B\times L\times D}$ (upstream is time-major ``(L, B, D)``), pre-norm
$\hat x = \mathrm{LN}(x)$ (``norm``, eps $10^{-5}$):

1. $v = \mathrm{SiLU}(\hat xW_v + b_v)$ (``v_proj``, width $H$ = ``hdim``).
2. **TCN** (replaces ``MultiHeadEMA``): $y^{(0)} = \hat x$,
   $y^{(l)}_t = \sum_{s=0}^{k-1} w^{(l)}_{s}\odot y^{(l-1)}_{t-(k-1-s)d_l} + b^{(l)}$ — causal
   depthwise convolutions with dilations $d_l = 2^l$ (``move.tcn.{l}``, torch ``Conv1d`` layout
   ``(D, 1, k)``) — then MEGA's wrapper $m = \mathrm{SiLU}(y^{(n)} + \omega\odot\hat x)$ (``move.omega``).
3. $[u' | z' | r' | h'] = mW_{mx} + b_{mx}$ (``mx_proj``, widths $D, Z, H, D$); $u = \sigma(u')$,
   $z = \mathrm{SiLU}(z')$, $r = \mathrm{SiLU}(r')$, $q = z\odot\gamma_0 + \beta_0$,
   $k = z\odot\gamma_1 + \beta_1$ (``gamma``, ``beta``).
4. **Chunked attention**: the sequence is cut into chunks of $c$ (``chunk_size``; $L$ a multiple
   of $c$, or $L\le c$ for one chunk); inside a chunk
   $A = \mathrm{softmax}(Z^{-1/2}qk^\top + P + M)$ with the relative bias
   $P_{ij} = \pi_{c-1+j-i}$ (``rel_pos_bias``, length $2c-1$) and $M$ the causal mask when
   ``causal``; $h = Av$.
5. $g = \mathrm{SiLU}(h' + (h\odot r)W_h + b_h)$ (``h_proj``), $\mathrm{out} = x + u\odot(g - x)$.

The explicit form is dense $L\times L$ attention with a block-diagonal mask and the bias
$P_{i \bmod c,\,j \bmod c}$ inside blocks, and the TCN written as one long causal filter: the
registry reference evaluates both (equal to round-off, forward; gradients by the FD checks).

Backward
--------
$\bar x$ collects $(1-u)\bar{\mathrm{out}}$ directly; $\bar u = \bar{\mathrm{out}}\odot(g - x)$,
$\bar g = u\odot\bar{\mathrm{out}}$, through SiLU/sigmoid derivatives and the linear VJPs;
the chunked softmax VJP (`refattn.nn.softmax.softmax_vjp`) per chunk with
$\bar P_{ij}$ accumulated into $\bar\pi_{c-1+j-i}$; $\bar q\to\bar z\odot\gamma_0$, $\bar\gamma_0 =
\sum\bar q\odot z$, likewise for $k$; each causal dilated convolution's adjoint is
`refattn.nn.conv.conv_vjp` (the correlation with the flipped kernel, cropped); then the
layer-norm VJP.

Reconstruction (marked in the docs): the TCN's structure — $n$ linear depthwise causal
convolutions with dilations $1, 2, 4, \dots$, kernel size $k$ (keywords ``tcn_layers``,
``tcn_kernel_size``; defaults 4 and 2), kept inside MEGA's ``SiLU(· + omega x)`` wrapper — is the
simplest reading of "a special temporal convolutional network" replacing the linear recurrence;
the paper's exact TCN (activations, residuals, kernel size) was not available. Everything else is
MEGA's code: softmax attention activation, prenorm, no dropout (upstream's dropouts are off in
evaluation), simple relative bias.

Measured agreement with upstream: MEGA's ``MovingAverageGatedAttention`` was run from the
repository at the commit above (fairseq's helpers it imports stubbed with their torch
equivalents; ``utils.softmax``'s float32 cast removed for the float64 run) with its ``move``
module replaced by a torch transcription of the TCN above; float64, $B=2$, $L=12$, $D=6$,
$Z=4$, $H=8$, chunk 4, causal and bidirectional masks, 3 TCN layers of kernel 2: output max abs
error 1.3e-15 (rel 4.8e-16); gradients of $x$ and of the 18 parameter arrays max rel error
4.9e-15, except ``beta`` (its key row has an analytically zero gradient — the softmax is
invariant to it — and its query row is small), which agrees to 1.5e-17 absolute. The relative
bias layout $P_{ij} = \pi_{c-1+j-i}$ is upstream's ``SimpleRelativePositionalBias`` (run, not
transcribed).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params
from ...nn.activations import sigmoid, silu, silu_grad
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...nn.norms import layer_norm_backward, layer_norm_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = ["tcnca_attention_forward", "tcnca_attention_backward", "tcnca_attention", "tcn_forward",
           "init_tcnca_params"]


def tcn_forward(x, weights, biases):
    """The causal dilated depthwise TCN on ``x (B, D, L)``: layer ``l`` has dilation ``2**l``,
    weight ``(D, 1, k)``, bias ``(D,)``. Returns the output and the per-layer inputs (for the VJP)."""
    inputs = []
    y = x
    for layer, (w, b) in enumerate(zip(weights, biases)):
        inputs.append(y)
        k, d = w.shape[-1], 2 ** layer
        y = conv_apply(y, w, b, padding=(((k - 1) * d, 0),), dilation=d, groups=x.shape[1])
    return y, inputs


def _tcn_vjp(g, weights, inputs, grads, prefix):
    for layer in reversed(range(len(weights))):
        w = weights[layer]
        k, d = w.shape[-1], 2 ** layer
        cg = conv_vjp(g, inputs[layer], w, padding=(((k - 1) * d, 0),), dilation=d, groups=w.shape[0])
        grads[f"{prefix}.{layer}.weight"], grads[f"{prefix}.{layer}.bias"] = cg["weight"], cg["bias"]
        g = cg["x"]
    return g


def _spec(D, Z, H, c, n_layers, k):
    spec = {"norm.weight": (D,), "norm.bias": (D,), "v_proj.weight": (D, H), "v_proj.bias": (H,),
            "mx_proj.weight": (D, Z + H + 2 * D), "mx_proj.bias": (Z + H + 2 * D,),
            "h_proj.weight": (H, D), "h_proj.bias": (D,), "gamma": (2, Z), "beta": (2, Z),
            "rel_pos_bias.rel_pos_bias": (2 * c - 1,), "move.omega": (D,)}
    for layer in range(n_layers):
        spec[f"move.tcn.{layer}.weight"], spec[f"move.tcn.{layer}.bias"] = (D, 1, k), (D,)
    return spec


def tcnca_attention_forward(x, params, *, chunk_size: int, causal: bool = True):
    r"""TCNCA gated attention layer on ``x (B, L, D)``; sizes $Z$ (``gamma`` width), $H$
    (``v_proj`` width), the TCN depth and kernel are read from ``params`` (see
    :func:`init_tcnca_params`). ``L`` must be a multiple of ``chunk_size`` or at most it.
    Returns ``(out (B, L, D), cache)``."""
    x = as_float(x, "x", ndim=3)
    B, L, D = x.shape
    c = check_int(chunk_size, "chunk_size", minimum=1)
    if L > c and L % c:
        raise ValueError(f"the sequence length L={L} must be a multiple of chunk_size={c} (or at most it)")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    n_layers = sum(1 for key in params if key.startswith("move.tcn.") and key.endswith(".weight"))
    gshape, vshape = np.shape(params.get("gamma")), np.shape(params.get("v_proj.weight"))
    wk = np.shape(params.get("move.tcn.0.weight"))
    if len(gshape) != 2 or len(vshape) != 2 or n_layers < 1 or len(wk) != 3:
        raise ValueError("params needs 'gamma' (2, Z), 'v_proj.weight' (D, H) and at least one 'move.tcn.{l}.weight' "
                         f"(D, 1, k); got shapes {gshape}, {vshape}, {wk}")
    Z, H, k = gshape[1], vshape[1], wk[-1]
    dt = x.dtype
    p = cast_all(dt, check_params(params, _spec(D, Z, H, c, n_layers, k), where="tcnca_attention"))
    xn, cn = layer_norm_forward(x, {"weight": p["norm.weight"], "bias": p["norm.bias"]})
    va = linear_prefixed(p, "v_proj", xn)
    v = silu(va)
    ws = [p[f"move.tcn.{i}.weight"] for i in range(n_layers)]
    y, tin = tcn_forward(np.swapaxes(xn, 1, 2), ws, [p[f"move.tcn.{i}.bias"] for i in range(n_layers)])
    ma = np.swapaxes(y, 1, 2) + p["move.omega"] * xn
    m = silu(ma)
    base = linear_prefixed(p, "mx_proj", m)
    ua, zra, hx = base[..., :D], base[..., D:D + Z + H], base[..., D + Z + H:]
    u = sigmoid(ua)
    zr = silu(zra)
    z, r = zr[..., :Z], zr[..., Z:]
    q = z * p["gamma"][0] + p["beta"][0]
    kk = z * p["gamma"][1] + p["beta"][1]
    cl = min(c, L)
    nc = L // cl
    qc, kc, vc = q.reshape(B, nc, cl, Z), kk.reshape(B, nc, cl, Z), v.reshape(B, nc, cl, H)
    rel = c - 1 + np.arange(cl)[None, :] - np.arange(cl)[:, None]                # index into rel_pos_bias
    s = (qc * dt.type(Z ** -0.5)) @ np.swapaxes(kc, -1, -2) + p["rel_pos_bias.rel_pos_bias"][rel]
    if causal:
        s = np.where(np.tril(np.ones((cl, cl), dtype=bool)), s, -np.inf)
    a, _ = softmax_lse(s, axis=-1)
    h = (a @ vc).reshape(B, L, H)
    ga = hx + linear_prefixed(p, "h_proj", h * r)
    g = silu(ga)
    out = x + u * (g - x)
    cache = {"p": p, "x": x, "cn": cn, "xn": xn, "va": va, "v": v, "ws": ws, "tin": tin, "ma": ma, "m": m,
             "ua": ua, "u": u, "zra": zra, "z": z, "r": r, "qc": qc, "kc": kc, "vc": vc, "rel": rel, "a": a, "h": h,
             "ga": ga, "g": g, "dims": (Z, H, c, cl, nc, n_layers), "dtype": dt, "shape": out.shape}
    return out, cache


def tcnca_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`tcnca_attention_forward` w.r.t. ``x`` and every parameter."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    p, x = cache["p"], cache["x"]
    Z, H, c, cl, nc, n_layers = cache["dims"]
    B, L, D = x.shape
    grads: dict = {}
    u, g = cache["u"], cache["g"]
    dx = dout * (1.0 - u)
    dua = dout * (g - x) * u * (1.0 - u)
    dga = dout * u * silu_grad(cache["ga"])
    dhr = linear_prefixed_vjp(grads, p, "h_proj", dga, cache["h"] * cache["r"])
    dh, dr = dhr * cache["r"], dhr * cache["h"]
    dhc = dh.reshape(B, nc, cl, H)
    a, qc, kc, vc = cache["a"], cache["qc"], cache["kc"], cache["vc"]
    dv = (np.swapaxes(a, -1, -2) @ dhc).reshape(B, L, H)
    ds = softmax_vjp(a, dhc @ np.swapaxes(vc, -1, -2))
    scale = dt.type(Z ** -0.5)
    dq = (scale * ds @ kc).reshape(B, L, Z)
    dk = (scale * np.swapaxes(ds, -1, -2) @ qc).reshape(B, L, Z)
    dbias = np.zeros(2 * c - 1, dtype=dt)
    np.add.at(dbias, cache["rel"], ds.sum(axis=(0, 1)))
    grads["rel_pos_bias.rel_pos_bias"] = dbias
    z = cache["z"]
    grads["gamma"] = np.stack([np.sum(dq * z, axis=(0, 1)), np.sum(dk * z, axis=(0, 1))])
    grads["beta"] = np.stack([dq.sum(axis=(0, 1)), dk.sum(axis=(0, 1))])
    dz = dq * p["gamma"][0] + dk * p["gamma"][1]
    dzra = np.concatenate([dz, dr], axis=-1) * silu_grad(cache["zra"])
    dbase = np.concatenate([dua, dzra, dga], axis=-1)
    dm = linear_prefixed_vjp(grads, p, "mx_proj", dbase, cache["m"])
    dma = dm * silu_grad(cache["ma"])
    xn = cache["xn"]
    grads["move.omega"] = np.sum(dma * xn, axis=(0, 1))
    dxn = dma * p["move.omega"]
    dxn = dxn + np.swapaxes(_tcn_vjp(np.swapaxes(dma, 1, 2), cache["ws"], cache["tin"], grads, "move.tcn"), 1, 2)
    dxn = dxn + linear_prefixed_vjp(grads, p, "v_proj", dv * silu_grad(cache["va"]), xn)
    dn = layer_norm_backward(dxn, cache["cn"])
    grads["norm.weight"], grads["norm.bias"] = dn["weight"], dn["bias"]
    out = {"x": dx + dn["x"]}
    out.update({key: np.asarray(grads[key], dtype=dt) for key in p})
    return out


def tcnca_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`tcnca_attention_forward`."""
    return tcnca_attention_forward(x, params, **config)[0]


def init_tcnca_params(rng, D: int, *, zdim: int, hdim: int, chunk_size: int, tcn_layers: int = 4,
                      tcn_kernel_size: int = 2, scale: float = 1.0) -> dict:
    """Random parameters with upstream's names (MEGA initialises its projections with std 0.02;
    larger values here so that every path matters in tests)."""
    p = {}
    for key, shape in _spec(D, zdim, hdim, chunk_size, check_int(tcn_layers, "tcn_layers", minimum=1),
                            check_int(tcn_kernel_size, "tcn_kernel_size", minimum=1)).items():
        fan = shape[0] if len(shape) == 2 and key.endswith("weight") else (shape[-1] if len(shape) == 3 else 2)
        p[key] = scale * rng.standard_normal(shape) / np.sqrt(fan)
    p["norm.weight"] = 1.0 + 0.1 * rng.standard_normal(D)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_tcnca(rng, size):
    B, L, D, Z, H, c, n, k = (2, 4, 2, 2, 2, 2, 2, 2) if size == "tiny" else (2, 12, 6, 4, 8, 4, 3, 2)
    p = init_tcnca_params(rng, D, zdim=Z, hdim=H, chunk_size=c, tcn_layers=n, tcn_kernel_size=k)
    return Sample(inputs={"x": rng.standard_normal((B, L, D))}, params=p,
                  config={"chunk_size": c, "causal": size == "tiny"})


def _reference_tcnca(x, params, *, chunk_size, causal=True):
    """Explicit form: the TCN as loops over taps, dense L x L attention with a block-diagonal
    (and causal) mask and the bias P[i mod c, j mod c] inside blocks."""
    from scipy.special import expit

    B, L, D = x.shape
    Z, H = params["gamma"].shape[1], params["v_proj.weight"].shape[1]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    xn = (x - mu) / np.sqrt(var + 1e-5) * params["norm.weight"] + params["norm.bias"]
    sl = lambda t: t * expit(t)  # noqa: E731
    v = sl(xn @ params["v_proj.weight"] + params["v_proj.bias"])
    y = xn.copy()
    layer = 0
    while f"move.tcn.{layer}.weight" in params:
        w, b, d = params[f"move.tcn.{layer}.weight"][:, 0], params[f"move.tcn.{layer}.bias"], 2 ** layer
        k = w.shape[-1]
        nxt = np.zeros_like(y) + b
        for t in range(L):
            for s in range(k):
                src = t - (k - 1 - s) * d
                if src >= 0:
                    nxt[:, t] += w[:, s] * y[:, src]
        y, layer = nxt, layer + 1
    m = sl(y + params["move.omega"] * xn)
    base = m @ params["mx_proj.weight"] + params["mx_proj.bias"]
    u, z, r, hx = expit(base[..., :D]), sl(base[..., D:D + Z]), sl(base[..., D + Z:D + Z + H]), base[..., D + Z + H:]
    q, kk = z * params["gamma"][0] + params["beta"][0], z * params["gamma"][1] + params["beta"][1]
    cl = min(chunk_size, L)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    keep = (i // cl == j // cl) & ((j <= i) if causal else True)
    bias = params["rel_pos_bias.rel_pos_bias"][chunk_size - 1 + (j % cl) - (i % cl)]
    s = np.where(keep, q @ np.swapaxes(kk, -1, -2) / np.sqrt(Z) + bias, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    h = (e / e.sum(-1, keepdims=True)) @ v
    g = sl(hx + (h * r) @ params["h_proj.weight"] + params["h_proj.bias"])
    return x + u * (g - x)


def _check_tcn_receptive_field(rng):
    """Impulse response of the TCN (zero biases): nonzero exactly on 0 <= t - t0 < 1 + (k-1)(2^n - 1)
    (brute force over impulse positions; positive kernels avoid cancellations)."""
    n, k, L, D = 3, 2, 20, 2
    ws = [rng.uniform(0.5, 1.5, (D, 1, k)) for _ in range(n)]
    bs = [np.zeros(D) for _ in range(n)]
    rf = 1 + (k - 1) * (2 ** n - 1)
    for t0 in range(L):
        x = np.zeros((1, D, L))
        x[0, :, t0] = 1.0
        y, _ = tcn_forward(x, ws, bs)
        nz = np.flatnonzero(np.abs(y[0, 0]) > 0)
        want = np.arange(t0, min(L, t0 + rf))
        assert np.array_equal(nz, want), (t0, nz, want)
    return 0.0


def _check_causal_and_chunk_local(rng):
    """Causal mode: the output at t does not depend on x after t. Attention is chunk-local: with
    the TCN and omega zeroed (no mixing across tokens outside attention), perturbing a token
    changes only outputs in its own chunk."""
    s = _sample_tcnca(rng, "small")
    cfg = {"chunk_size": 4, "causal": True}
    x, p = s.inputs["x"], s.params
    y = tcnca_attention(x, p, **cfg)
    xp = x.copy()
    xp[:, 7] += rng.standard_normal(x.shape[-1])     # not a constant shift: the layer norm would remove it
    d = np.abs(tcnca_attention(xp, p, **cfg) - y).max(axis=(0, 2))
    assert np.all(d[:7] == 0) and d[7] > 0, d
    p0 = dict(p)
    for key in p0:
        if key.startswith("move.tcn") and key.endswith("weight"):
            p0[key] = np.zeros_like(p[key])
    y0 = tcnca_attention(x, p0, chunk_size=4, causal=False)
    d0 = np.abs(tcnca_attention(xp, p0, chunk_size=4, causal=False) - y0).max(axis=(0, 2))
    assert np.all(d0[:4] == 0) and np.all(d0[8:] == 0) and np.all(d0[4:8] > 0), d0
    return 0.0


def _check_gradients_equal_dense_form(rng):
    """The fast form's hand-derived gradients equal the explicit form's (central difference of
    the registry reference along a random direction over every input and parameter)."""
    from ._samples import reference_gradient_error

    err = reference_gradient_error(tcnca_attention_forward, tcnca_attention_backward, _reference_tcnca, _sample_tcnca(rng, "small"), rng)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="tcnca_chunked_attention", family="4-linear-kernel-sparse", tier="T2",
        title="TCNCA: dilated TCN + chunked (block-diagonal) gated attention",
        paper="Terzić, Hersche, Karunaratne, Benini, Sebastian, Rahimi, 'TCNCA: Temporal Convolution Network with "
              "Chunked Attention for Scalable Sequence Processing', NeurIPS 2023 ENLSP workshop, arXiv 2312.05605",
        seeds=("3-21",),
        official_code="",
        forward=tcnca_attention_forward, backward=tcnca_attention_backward, sample=_sample_tcnca,
        reference=_reference_tcnca,
        checks={"tcn_receptive_field_brute_force": _check_tcn_receptive_field,
                "gradients_equal_dense_form": _check_gradients_equal_dense_form,
                "causal_and_chunk_local": _check_causal_and_chunk_local},
        docs="linear/l6a.md#tcnca-chunked-attention",
    ),
)
