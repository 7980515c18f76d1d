r"""Magnetic-Laplacian positional encodings for directed graphs (the eigenvectors and their sign-invariant
encoder, MagLapNet).

Paper: Geisler, Li, Mankowitz, Cemgil, Günnemann, Paduraru, "Transformers Meet Directed Graphs",
ICML 2023, arXiv 2302.00049. Upstream (verified: the catalogue's "reported as" is right):
deepmind/digraph_transformer @085603b445b47f235339394e001b4cabee94c4f6 — ``utils.py``
(``eigv_magnetic_laplacian_numba``), ``dataset_utils.py`` (where the eigenvectors are computed, in the
data pipeline) and ``models.py`` (``MagLapNet``, ``StructureAwareTransformer.positional_encodings``).

1. The encoding (a fixed input, as upstream)
--------------------------------------------
For a directed graph with adjacency $A$ ($A_{uv} = 1$ for an edge $u\to v$, entries above 1 clipped),
$A_s = A\lor A^\top$ (upstream: $A + A^\top$, halved where both directions exist), degrees
$D_s = \mathrm{diag}(A_s\mathbf 1)$, phases $\Theta^{(q)} = 2\pi q\,(A - A^\top)$ and

$$L^{(q)} = D_s - A_s\odot e^{i\Theta^{(q)}}\quad(\text{default}),\qquad
  L^{(q)}_{\text{sym}} = I - \big(D_s^{-1/2}A_sD_s^{-1/2}\big)\odot e^{i\Theta^{(q)}}\quad(\texttt{use\_symmetric\_norm}),$$

a Hermitian matrix ($q = 0$: the combinatorial / symmetric-normalised Laplacian of the undirected
graph; degrees below 1 are replaced by 1 in $D_s^{-1/2}$, as upstream). ``q_absolute=False`` divides
$q$ by $\min(m_{\text{dir}}, n)$, $m_{\text{dir}}$ the number of one-directional edges.
`magnetic_laplacian_eigenpairs` returns the eigenvalues $\lambda_{k_{\text{ex}}}, \dots$ (ascending,
``k`` of them after skipping ``k_excl``) and the eigenvectors (columns) of ``np.linalg.eigh``.

**Gauge.** An eigenvector of a Hermitian matrix is defined up to a phase $e^{i\alpha}$ (a sign for
$q = 0$), and within a degenerate eigenspace only the subspace is defined. Upstream computes the
encoding once per graph in the data pipeline (numpy, no gradient) and feeds it to a *sign*-invariant
network (below); refattn does the same: the eigen-decomposition is a fixed preprocessing step, not
differentiated (its derivative is ill-conditioned near degenerate eigenvalues), and the phase
convention is a keyword:

* ``phase_convention="none"`` (default): ``eigh``'s output as is. This is upstream's effective
  default: ``dataset_utils`` passes ``sign_rotate=not maglap_sign_rotate`` and every config sets
  ``maglap_sign_rotate=True``.
* ``"upstream_sign_rotate"``: upstream's ``sign_rotate=True`` branch (sign from the largest-|real| entry
  of each column, then every column rotated by the phase of its entry at the node where column 0 has
  its largest imaginary part). Not invariant to the phase ``eigh`` happens to return.
* ``"max_entry"``: a true gauge for non-degenerate eigenvalues: each column is rotated so that its
  largest-modulus entry (lowest index on ties) is real and positive — identical output for
  $v$ and $e^{i\alpha}v$ (checked).

``l2_norm`` (True: unit columns) / ``norm_comps_sep`` (separate real/imaginary rescaling) as upstream.

2. The encoder (differentiable): ``magnetic_laplacian_pe``
----------------------------------------------------------
Upstream ``MagLapNet`` with its defaults (one-layer MLPs, no LayerNorm, ``use_gnn=False``,
``use_attention=False``) and ``relative_positional_encodings=False`` (the encoding is added to the node
embeddings). For node features $x$ ``(B, n, D)``, eigenvalues $\lambda$ ``(B, k)`` and eigenvectors
stacked as real and imaginary parts $E$ ``(B, n, k, 2)`` (`maglap_stack`):

$$h = \sigma(EW_e + b_e) + \sigma(-EW_e + b_e)\quad(\text{SignNet: } h(E) = h(-E)),$$

optionally $h \leftarrow [\lambda, h]$ (``concatenate_eigenvalues``), $h \leftarrow h\odot m$ with the
padding mask $m_{k} = [\lambda_k > 0]$, $m_0 = 1$ (a fixed selection), flattened over the $k$
eigenvectors to ``(B, n, k F)``, then $\mathrm{PE} = \sigma(\mathrm{flat}\,W_a + b_a)$ and
$y = x + \mathrm{PE}$. ``consider_im_part=False`` (upstream: when $q = 0$) uses the real part only.
Parameters: ``re_element.weight (2 or 1, E)``, ``re_element.bias (E,)`` (haiku module ``re_element``:
one ``Linear``, ``w`` stored ``(in, out)`` like refattn, ``E = 2 * d_model_elem`` with the imaginary
part, upstream ``d_model_elem = d_model // 32``), ``re_aggregate.weight (k F, D)``,
``re_aggregate.bias (D,)``. $\sigma$ = ``activation``: ``"relu"`` (upstream default) or ``"gelu"``
(``jax.nn.gelu``, the tanh approximation).

Backward: $dx = dy$; $dz_a = dy\odot\sigma'(z_a)$, $dW_a = \mathrm{flat}^\top dz_a$, $d\,\mathrm{flat} = dz_a W_a^\top$,
unflattened and masked; the $\lambda$ column (if concatenated) gives $d\lambda = \sum_n(\cdot)$; then
$dz_\pm = dh\odot\sigma'(z_\pm)$ with $z_\pm = \pm EW_e + b_e$: $dW_e = E^\top(dz_+ - dz_-)$,
$db_e = \sum(dz_+ + dz_-)$, $dE = (dz_+ - dz_-)W_e^\top$. The ReLU kinks are avoided by the sampler.

Not implemented: upstream's optional extras of ``MagLapNet`` — ``use_gnn`` (a GNN instead of the
element MLP), ``use_attention`` (self-attention across the $k$ eigenvector embeddings of a node; the
``maglappos`` preset switches it on via ``maglap_transformer=True``), ``n_layers > 1``, dropout and the
complex output used by ``relative_positional_encodings=True``. The defaults of the class are what is
implemented.

3. Agreement with upstream (float64, CPU)
------------------------------------------
* Eigenpairs: upstream ``utils.eigv_magnetic_laplacian_numba`` itself (numba-compiled, run as is) against
  `magnetic_laplacian_eigenpairs` on random digraphs with $n \in \{4, 6, 9\}$, every combination of
  ``q`` $\in\{0, 0.1, 0.25\}$, ``q_absolute``, ``norm_comps_sep``, ``l2_norm``, ``sign_rotate``
  (= ``phase_convention="upstream_sign_rotate"``) and ``use_symmetric_norm`` (1152 cases): max abs
  difference 4.7e-16 (eigenvalues and eigenvectors).
* Encoder: upstream ``MagLapNet.__call__`` is JAX/haiku (not installable here), so its math was
  transcribed into a float64 torch scratch script (not committed): output 4.4e-16, every gradient
  (``x``, eigenvalues, eigenvectors, four parameters) 3.6e-15 max abs, over all 16 combinations of
  ``concatenate_eigenvalues``/``use_signnet``/``consider_im_part`` and both activations.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.activations import gelu, gelu_grad
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "MAGLAP_PHASE_CONVENTIONS",
    "MAGLAP_ACTIVATIONS",
    "magnetic_laplacian_matrix",
    "magnetic_laplacian_eigenpairs",
    "maglap_stack",
    "maglap_pe_param_spec",
    "init_maglap_pe_params",
    "maglap_pe_forward",
    "maglap_pe_backward",
    "maglap_pe",
]

MAGLAP_PHASE_CONVENTIONS = ("none", "upstream_sign_rotate", "max_entry")
MAGLAP_ACTIVATIONS = ("relu", "gelu")
_EPS = 1e-8  # upstream utils.EPS (threshold of norm_comps_sep)


def _adjacency(adjacency):
    a = np.asarray(adjacency)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"adjacency must be a boolean or real (n, n) array; got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValueError(f"adjacency must be a square (n, n) array; got shape {a.shape}")
    a = a.astype(np.float64)
    if not np.isfinite(a).all() or (a < 0).any():
        raise ValueError("adjacency must be finite and non-negative (1 = edge u -> v)")
    return np.where(a > 1, 1.0, a)


def magnetic_laplacian_matrix(adjacency, *, q: float = 0.25, q_absolute: bool = True,
                       use_symmetric_norm: bool = False) -> np.ndarray:
    r"""The Hermitian magnetic Laplacian $L^{(q)}$ ``(n, n)`` complex128 of a directed graph (module docstring)."""
    a = _adjacency(adjacency)
    q = check_positive(q, "q", allow_zero=True)
    n = a.shape[0]
    sym = a + a.T
    sym = np.where((a != 0) & (a.T != 0), sym / 2, sym)
    deg = sym.sum(-2)
    if not q_absolute:
        m_dir = min((a != a.T).sum() / 2, n)
        q = q / (m_dir if m_dir > 0 else 1)
    phase = np.exp(1j * 2 * np.pi * q * (a - a.T))
    if use_symmetric_norm:
        inv = 1.0 / np.sqrt(np.where(deg < 1, 1.0, deg))
        return np.eye(n) - (inv[:, None] * sym * inv[None, :]) * phase
    return np.diag(deg) - sym * phase


def magnetic_laplacian_eigenpairs(adjacency, *, k: int = 5, k_excl: int = 1, q: float = 0.25,
                                  q_absolute: bool = True, use_symmetric_norm: bool = False,
                                  phase_convention: str = "none", l2_norm: bool = True,
                                  norm_comps_sep: bool = False):
    r"""Eigenvalues ``(k',)`` and eigenvectors ``(n, k')`` (complex) of $L^{(q)}$, ``k' = min(k, n - k_excl)``.

    The smallest ``k_excl`` eigenpairs are skipped (upstream default 1); ``phase_convention``,
    ``l2_norm`` and ``norm_comps_sep`` as in the module docstring. A fixed preprocessing step (no
    gradient), as upstream's data pipeline.
    """
    k, k_excl = check_size(k, "k"), check_size(k_excl, "k_excl", 0)
    check_choice(phase_convention, "phase_convention", MAGLAP_PHASE_CONVENTIONS)
    lap = magnetic_laplacian_matrix(adjacency, q=q, q_absolute=q_absolute, use_symmetric_norm=use_symmetric_norm)
    lam, vec = np.linalg.eigh(lap)
    lam, vec = lam[k_excl:k_excl + k], vec[:, k_excl:k_excl + k]
    if phase_convention == "upstream_sign_rotate" and vec.shape[1]:
        sign = np.array([np.sign(vec[np.abs(vec[:, i].real).argmax(), i].real) for i in range(vec.shape[1])])
        vec = sign[None, :] * vec
        r = vec[:, 0].imag.argmax()
        vec = vec * np.exp(-1j * np.angle(vec[r:r + 1]))
    elif phase_convention == "max_entry" and vec.shape[1]:
        top = np.abs(vec).argmax(axis=0)                       # argmax takes the lowest index on ties
        vec = vec * np.exp(-1j * np.angle(vec[top, np.arange(vec.shape[1])]))[None, :]
    n = vec.shape[0]
    if norm_comps_sep:
        eps = _EPS / np.sqrt(n)
        for part in ("real", "imag"):
            comp = vec.real if part == "real" else vec.imag
            scale = np.linalg.norm(comp, axis=0) if l2_norm else np.abs(comp).max(axis=0)
            ok = np.abs(comp).sum(0) / n > eps
            scaled = comp[:, ok] / scale[ok]
            vec = vec.copy()
            if part == "real":
                vec[:, ok] = scaled + 1j * vec[:, ok].imag
            else:
                vec[:, ok] = vec[:, ok].real + 1j * scaled
    elif not l2_norm:
        vec = vec / np.abs(vec).max(axis=0)
    return lam.real, vec


def maglap_stack(eigenvectors) -> np.ndarray:
    """Complex eigenvectors ``(..., n, k)`` -> real ``(..., n, k, 2)`` (real, imaginary): the encoder's input."""
    e = np.asarray(eigenvectors)
    return np.stack([e.real, e.imag], axis=-1).astype(np.float64)


def maglap_pe_param_spec(d_model: int, k: int, *, d_model_elem=None, consider_im_part: bool = True,
                         concatenate_eigenvalues: bool = False):
    """``(spec, optional)`` of the encoder (``d_model_elem`` default ``max(d_model // 32, 1)`` as upstream)."""
    d_model, k = check_size(d_model, "d_model"), check_size(k, "k")
    de = max(d_model // 32, 1) if d_model_elem is None else check_size(d_model_elem, "d_model_elem")
    e = 2 * de if consider_im_part else de
    f = e + (1 if concatenate_eigenvalues else 0)
    spec = {"re_element.weight": (2 if consider_im_part else 1, e), "re_element.bias": (e,),
            "re_aggregate.weight": (k * f, d_model), "re_aggregate.bias": (d_model,)}
    return spec, ()


def init_maglap_pe_params(rng, d_model: int, k: int, **config) -> dict:
    """Uniform $\\pm 1/\\sqrt{\\text{fan-in}}$ weights and $\\mathcal N(0, 0.1^2)$ biases (haiku uses truncated normal, zeros)."""
    spec, _ = maglap_pe_param_spec(d_model, k, **config)
    p = {}
    for key, shp in spec.items():
        p[key] = (rng.uniform(-1, 1, shp) / np.sqrt(shp[0])) if len(shp) == 2 else 0.1 * rng.standard_normal(shp)
    return p


def _act(z, name):
    return np.maximum(z, 0.0) if name == "relu" else gelu(z, "tanh")


def _act_grad(z, name):
    return (z > 0).astype(z.dtype) if name == "relu" else gelu_grad(z, "tanh")


def maglap_pe_forward(x, eigenvalues, eigenvectors, params, *, concatenate_eigenvalues: bool = False,
                      use_signnet: bool = True, consider_im_part: bool = True, activation: str = "relu"):
    r"""MagLapNet: node features plus the sign-invariant encoding of the magnetic-Laplacian eigenvectors.

    Parameters
    ----------
    x : array (B, n, D)
        Node embeddings.
    eigenvalues : array (B, k)
        Differentiated only when ``concatenate_eigenvalues``; $\lambda_k > 0$ selects the encoded
        eigenvectors (the first always counts), a fixed mask.
    eigenvectors : array (B, n, k, 2)
        Real and imaginary parts (`maglap_stack` of `magnetic_laplacian_eigenpairs`).
    params : dict
        `maglap_pe_param_spec` keys.
    concatenate_eigenvalues, use_signnet, consider_im_part : bool
        Upstream ``MagLapNet`` options (defaults False, True, True).
    activation : {"relu", "gelu"}

    Returns
    -------
    y, cache
        ``y = x + PE`` of shape (B, n, D).
    """
    x = as_float(x, "x", ndim=3)
    lam = as_float(eigenvalues, "eigenvalues", ndim=2)
    vec = as_float(eigenvectors, "eigenvectors", ndim=4)
    b, n, dm = x.shape
    kk = lam.shape[1]
    if lam.shape[0] != b:
        raise ValueError(f"eigenvalues must have shape (B={b}, k); got {lam.shape}")
    if vec.shape != (b, n, kk, 2):
        raise ValueError(f"eigenvectors must have shape (B, n, k, 2) = ({b}, {n}, {kk}, 2) (real, imaginary); "
                         f"got {vec.shape}")
    for nm, val in (("concatenate_eigenvalues", concatenate_eigenvalues), ("use_signnet", use_signnet),
                    ("consider_im_part", consider_im_part)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{nm} must be a bool; got {type(val).__name__}")
    check_choice(activation, "activation", MAGLAP_ACTIVATIONS)
    if not isinstance(params, dict) or "re_element.weight" not in params:
        raise TypeError("params must be a dict with re_element.weight/bias and re_aggregate.weight/bias")
    we = as_float(params["re_element.weight"], "re_element.weight", ndim=2)
    spec, _ = maglap_pe_param_spec(dm, kk, d_model_elem=max(we.shape[1] // (2 if consider_im_part else 1), 1),
                                   consider_im_part=bool(consider_im_part),
                                   concatenate_eigenvalues=bool(concatenate_eigenvalues))
    p = check_params(params, spec, where="maglap_pe (MagLapNet)")
    dt = compute_dtype(x, lam, vec, *p.values())
    x, lam, vec, p = x.astype(dt, copy=False), lam.astype(dt, copy=False), vec.astype(dt, copy=False), cast_all(dt, p)
    t = vec if consider_im_part else vec[..., :1]
    zp = t @ p["re_element.weight"] + p["re_element.bias"]
    h = _act(zp, activation)
    zm = None
    if use_signnet:
        zm = -t @ p["re_element.weight"] + p["re_element.bias"]
        h = h + _act(zm, activation)
    if concatenate_eigenvalues:
        h = np.concatenate([np.broadcast_to(lam[:, None, :, None], (b, n, kk, 1)), h], axis=-1)
    mask = lam > 0
    mask[:, 0] = True
    h = h * mask[:, None, :, None].astype(dt)
    flat = h.reshape(b, n, -1)
    za = flat @ p["re_aggregate.weight"] + p["re_aggregate.bias"]
    y = x + _act(za, activation)
    cache = {"p": p, "t": t, "zp": zp, "zm": zm, "flat": flat, "za": za, "mask": mask, "act": activation,
             "concat": bool(concatenate_eigenvalues), "im": bool(consider_im_part), "shape": y.shape,
             "lam_shape": lam.shape, "vec_shape": vec.shape, "dt": dt}
    return y, cache


def maglap_pe_backward(dout, cache):
    """Gradient of :func:`maglap_pe_forward`: ``x, eigenvalues, eigenvectors`` and the four parameters."""
    p, act, dt = cache["p"], cache["act"], cache["dt"]
    g = as_dout(dout, cache["shape"], dt)
    b, n, _ = cache["shape"]
    kk = cache["lam_shape"][1]
    dza = g * _act_grad(cache["za"], act)
    flat = cache["flat"]
    grads = {"re_aggregate.weight": flat.reshape(-1, flat.shape[-1]).T @ dza.reshape(-1, dza.shape[-1]),
             "re_aggregate.bias": dza.reshape(-1, dza.shape[-1]).sum(0)}
    dh = (dza @ p["re_aggregate.weight"].T).reshape(b, n, kk, -1) * cache["mask"][:, None, :, None].astype(dt)
    dlam = np.zeros(cache["lam_shape"], dtype=dt)
    if cache["concat"]:
        dlam = dh[..., 0].sum(axis=1)
        dh = dh[..., 1:]
    t, w = cache["t"], p["re_element.weight"]
    dzp = dh * _act_grad(cache["zp"], act)
    dzm = dh * _act_grad(cache["zm"], act) if cache["zm"] is not None else np.zeros_like(dzp)
    dzd = dzp - dzm
    grads["re_element.weight"] = t.reshape(-1, t.shape[-1]).T @ dzd.reshape(-1, dzd.shape[-1])
    grads["re_element.bias"] = (dzp + dzm).reshape(-1, dzp.shape[-1]).sum(0)
    dt_ = dzd @ w.T
    dvec = dt_ if cache["im"] else np.concatenate([dt_, np.zeros_like(dt_)], axis=-1)
    return {"x": g.copy(), "eigenvalues": dlam, "eigenvectors": dvec, **{key: grads[key] for key in p}}


def maglap_pe(x, eigenvalues, eigenvectors, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`maglap_pe_forward`."""
    return maglap_pe_forward(x, eigenvalues, eigenvectors, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _random_digraph(rng, n):
    # a directed path through a random permutation (connected) plus a few random extra edges
    a = np.zeros((n, n))
    perm = rng.permutation(n)
    a[perm[:-1], perm[1:]] = 1.0
    extra = rng.random((n, n)) < 0.25
    np.fill_diagonal(extra, False)
    return np.maximum(a, extra)


def _sample(rng, size):
    if size == "tiny":
        n, kk, dm, de = int(rng.integers(3, 5)), 2, 3, 1
    else:
        n, kk, dm, de = int(rng.integers(5, 8)), 3, 6, 2
    cfg = {"concatenate_eigenvalues": bool(rng.random() < 0.5), "use_signnet": bool(rng.random() < 0.8),
           "activation": str(rng.choice(MAGLAP_ACTIVATIONS))}
    lams, vecs = [], []
    for _ in range(2):
        lam, vec = magnetic_laplacian_eigenpairs(_random_digraph(rng, n), k=kk, q=0.25,
                                                 use_symmetric_norm=bool(rng.random() < 0.5))
        lams.append(lam)
        vecs.append(maglap_stack(vec))
    x = rng.standard_normal((2, n, dm))
    lam, vec = np.array(lams), np.array(vecs)
    margin = 0.02 if size == "tiny" else 2e-3
    for _ in range(300):  # keep every ReLU input away from its kink (FD steps ~1e-6 tiny, ~1e-5 directional)
        p = init_maglap_pe_params(rng, dm, kk, d_model_elem=de, concatenate_eigenvalues=cfg["concatenate_eigenvalues"])
        p = {key: 2.0 * val for key, val in p.items()}
        _, c = maglap_pe_forward(x, lam, vec, p, **cfg)
        zs = [c["zp"], c["za"]] + ([c["zm"]] if c["zm"] is not None else [])
        if cfg["activation"] == "gelu" or min(float(np.abs(z).min()) for z in zs) > margin:
            break
    return Sample(inputs={"x": x, "eigenvalues": lam, "eigenvectors": vec}, params=p, config=cfg)


def _reference(x, eigenvalues, eigenvectors, params, *, concatenate_eigenvalues=False, use_signnet=True,
               consider_im_part=True, activation="relu"):
    # Per graph, node and eigenvector: the MagLapNet formula written out.
    b, n, dm = x.shape
    kk = eigenvalues.shape[1]
    out = np.array(x, dtype=float)
    for bb in range(b):
        for u in range(n):
            feats = []
            for j in range(kk):
                e = eigenvectors[bb, u, j] if consider_im_part else eigenvectors[bb, u, j, :1]
                h = _act(e @ params["re_element.weight"] + params["re_element.bias"], activation)
                if use_signnet:
                    h = h + _act(-e @ params["re_element.weight"] + params["re_element.bias"], activation)
                if concatenate_eigenvalues:
                    h = np.concatenate([[eigenvalues[bb, j]], h])
                keep = j == 0 or eigenvalues[bb, j] > 0
                feats.append(h if keep else 0 * h)
            out[bb, u] += _act(np.concatenate(feats) @ params["re_aggregate.weight"] + params["re_aggregate.bias"],
                               activation)
    return out


def _check_laplacian_properties(rng):
    # L is Hermitian; q = 0 gives the (normalised) Laplacian of the undirected graph; the spectrum of the
    # combinatorial one is >= 0 and of the normalised one in [0, 2].
    a = _random_digraph(rng, 6)
    errs = []
    for sym in (False, True):
        lap = magnetic_laplacian_matrix(a, q=0.2, use_symmetric_norm=sym)
        errs.append(float(np.abs(lap - lap.conj().T).max()))
        lam = np.linalg.eigvalsh(lap)
        assert lam.min() > -1e-12 and (not sym or lam.max() < 2 + 1e-12), lam
        l0 = magnetic_laplacian_matrix(a, q=0.0, use_symmetric_norm=sym)
        au = np.maximum(a, a.T)
        deg = au.sum(1)
        want = np.diag(deg) - au if not sym else np.eye(6) - au / np.sqrt(np.outer(deg, deg))
        errs.append(float(np.abs(l0 - want).max()))
        assert np.abs(l0.imag).max() == 0.0
    # a direction-only change (reversing one edge) changes L for q > 0 but not for q = 0
    b_ = a.copy()
    i, j = np.argwhere((a == 1) & (a.T == 0))[0]
    b_[i, j], b_[j, i] = 0.0, 1.0
    assert np.abs(magnetic_laplacian_matrix(a, q=0.25) - magnetic_laplacian_matrix(b_, q=0.25)).max() > 0.1
    errs.append(float(np.abs(magnetic_laplacian_matrix(a, q=0.0) - magnetic_laplacian_matrix(b_, q=0.0)).max()))
    err = max(errs)
    assert err < 1e-12, errs
    return err


def _check_eigenvectors_up_to_phase(rng):
    # Eigenpairs satisfy L v = lambda v; the 'max_entry' gauge removes the phase freedom exactly (v and
    # e^{i alpha} v give the same output) on a non-degenerate spectrum, and relabelling the nodes permutes
    # the gauged eigenvectors' rows.
    a = _random_digraph(rng, 7)
    lap = magnetic_laplacian_matrix(a, q=0.15)
    lam, vec = magnetic_laplacian_eigenpairs(a, k=4, q=0.15, phase_convention="max_entry")
    assert np.diff(np.linalg.eigvalsh(lap)).min() > 1e-6, "test graph has a degenerate spectrum"
    e1 = float(np.abs(lap @ vec - vec * lam).max())
    rot = vec * np.exp(1j * rng.uniform(0, 2 * np.pi, 4))
    top = np.abs(rot).argmax(axis=0)
    regauged = rot * np.exp(-1j * np.angle(rot[top, np.arange(4)]))
    e2 = float(np.abs(regauged - vec).max())
    perm = rng.permutation(7)
    lam_p, vec_p = magnetic_laplacian_eigenpairs(a[np.ix_(perm, perm)], k=4, q=0.15, phase_convention="max_entry")
    e3 = max(float(np.abs(lam_p - lam).max()), float(np.abs(vec_p - vec[perm]).max()))
    err = max(e1, e2, e3)
    assert err < 1e-10, (e1, e2, e3)
    return err


def _check_sign_invariance_and_mask(rng):
    # SignNet: flipping the sign of the eigenvectors leaves the encoding unchanged; eigenvectors whose
    # eigenvalue is <= 0 (padding) do not contribute, except the first.
    s = _sample(rng, "small")
    cfg = dict(s.config, use_signnet=True)
    x, lam, vec = s.inputs["x"], s.inputs["eigenvalues"], s.inputs["eigenvectors"]
    e1 = float(np.abs(maglap_pe(x, lam, vec, s.params, **cfg) - maglap_pe(x, lam, -vec, s.params, **cfg)).max())
    lam0 = lam.copy()
    lam0[:, -1] = 0.0
    vec2 = vec.copy()
    vec2[:, :, -1] = rng.standard_normal(vec2[:, :, -1].shape)
    y1, y2 = maglap_pe(x, lam0, vec, s.params, **cfg), maglap_pe(x, lam0, vec2, s.params, **cfg)
    e2 = float(np.abs(y1 - y2).max())
    err = max(e1, e2)
    assert err < 1e-12, (e1, e2)
    return err


register(
    Mechanism(
        slug="magnetic_laplacian_pe", family="1-softmax", tier="T2",
        title="Magnetic-Laplacian positional encodings for directed graphs",
        paper="Geisler, Li, Mankowitz, Cemgil, Gunnemann, Paduraru, Transformers Meet Directed Graphs, ICML 2023, "
              "arXiv 2302.00049",
        forward=maglap_pe_forward, backward=maglap_pe_backward, sample=_sample, reference=_reference,
        docs="softmax/positional-encodings.md#magnetic-laplacian-positional-encodings",
        checks={"laplacian_properties": _check_laplacian_properties,
                "eigenvectors_up_to_phase": _check_eigenvectors_up_to_phase,
                "sign_invariance_and_mask": _check_sign_invariance_and_mask},
    ),
)
