r"""PyTorch weights in refattn: ``params_from_state_dict``, ``grads_to_state_dict``, ``check_module``.

refattn computes ``y = x @ W + b`` with ``W (in, out)``; ``torch.nn.Linear`` stores
``weight (out, in)``. Passing ``q_proj.weight`` untransposed is a silent wrong answer whenever the
matrix is square (the shapes agree), so nobody should transpose by hand: this module maps an
upstream ``state_dict`` to refattn's params **by a per-slug table of rules**, keyed by the
upstream parameter names, never by shape guessing.

The rules
---------
``linear``
    A ``Linear`` weight, named alike on both sides: ``params[name] = state_dict[name].T``.
``copy``
    Same name, same layout (biases, λ vectors, norm weights, AFNO's real/imaginary blocks).
``split``
    A fused projection: ``in_proj_weight (3E, E)`` of ``torch.nn.MultiheadAttention`` becomes
    ``q_proj, k_proj, v_proj`` (each the matching row block, transposed); biases split alike.
``stack``
    Per-head modules: ``norm_K.0.weight … norm_K.{H-1}.weight`` (each ``(d,)``) become one
    ``norm_K.weight (H, d)``.
``complex``
    A complex spectral weight ``weights1 (C_in, C_out, m1[, m2])`` (``torch.cfloat``/``cdouble``)
    becomes ``weights1_real`` and ``weights1_imag``.
``reshape``
    Transolver's ``temperature (1, H, 1, 1)`` becomes ``(H,)``.

Conv kernels keep PyTorch's layout ``(C_out, C_in/groups, k...)`` in refattn (a ``copy`` rule).
Every map is a permutation of entries, so the same table maps gradients back: PyTorch's gradient of
a real loss w.r.t. a complex parameter $w = a + ib$ is $\partial L/\partial a + i\,\partial L/\partial b$,
exactly the pair refattn returns for ``_real`` / ``_imag``. ``grads_to_state_dict`` returns NumPy
arrays under the upstream names (with the prefix), ready for ``torch.from_numpy``.

``supported_slugs()`` lists the covered mechanisms with the upstream module each follows; any
other slug raises ``ValueError`` saying whether it has no upstream PyTorch module mapped here.

``check_module`` runs your ``nn.Module`` and refattn side by side (the module's own weights,
mapped by the table) on a battery of inputs sized for the module, and compares the output and the
gradient of every input and every parameter with
:func:`refattn.testing.compare_implementation`'s rules; it returns a
:class:`refattn.testing.CompareReport`.

torch is imported inside the functions that need it (``check_module``); ``params_from_state_dict``
and ``grads_to_state_dict`` accept torch tensors or NumPy arrays and do not import torch at all.

The per-slug table stays in this module beside the functions that read it, past 800 lines: a
slug's rules, input builder and call convention are written and reviewed together.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import registry
from ..registry import Sample
from ..testing.compare import CompareReport, compare_implementation, to_numpy

__all__ = ["params_from_state_dict", "grads_to_state_dict", "check_module", "supported_slugs",
           "MODULE_CASES"]


# --------------------------------------------------------------------------------------------
# Rules: one upstream name (or name family) <-> one refattn params key


_np = to_numpy  # torch tensors (any device) or NumPy arrays to NumPy


class _View:
    """The state_dict entries under ``prefix``; records which keys the rules consumed."""

    def __init__(self, state_dict: Mapping, prefix: str, slug: str):
        self.slug, self.prefix = slug, prefix
        self.items = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.items

    def require(self, name: str) -> None:
        if name not in self.items:
            near = sorted(self.items)[:12]
            raise ValueError(f"params_from_state_dict[{self.slug}]: the state_dict has no key "
                             f"{self.prefix + name!r}; keys under prefix {self.prefix!r}: {near}"
                             + (" ..." if len(self.items) > 12 else ""))

    def get(self, name: str) -> np.ndarray:
        self.require(name)
        self.used.add(name)
        return np.array(_np(self.items[name]))  # a copy: the params never alias the module's weights


@dataclass(frozen=True)
class _Named:
    """``linear`` (transpose) or ``copy`` for every name matching ``pattern`` (a full-match regex);
    the refattn key is the upstream name."""

    pattern: str
    transpose: bool

    def load(self, view: _View, out: dict) -> None:
        for name in sorted(view.items):
            if name not in view.used and re.fullmatch(self.pattern, name):
                a = view.get(name)
                out[name] = a.T if self.transpose else a

    def save(self, grads: dict, out: dict, used: set) -> None:
        for name in list(grads):
            if name not in used and re.fullmatch(self.pattern, name):
                used.add(name)
                g = _np(grads[name])
                out[name] = g.T if self.transpose else g


@dataclass(frozen=True)
class _Strip:
    """Upstream ``prefix + name`` to refattn ``name`` for names matching ``pattern`` (transposed or not)."""

    prefix: str
    pattern: str
    transpose: bool

    def load(self, view: _View, out: dict) -> None:
        for name in sorted(view.items):
            ref = name[len(self.prefix):]
            if name not in view.used and name.startswith(self.prefix) and re.fullmatch(self.pattern, ref):
                a = view.get(name)
                out[ref] = a.T if self.transpose else a

    def save(self, grads: dict, out: dict, used: set) -> None:
        for name in list(grads):
            if name not in used and re.fullmatch(self.pattern, name):
                used.add(name)
                g = _np(grads[name])
                out[self.prefix + name] = g.T if self.transpose else g


@dataclass(frozen=True)
class _Split:
    """A fused projection ``up`` split into ``len(refs)`` equal row blocks (transposed if a weight)."""

    refs: tuple
    up: str
    transpose: bool
    optional: bool = False

    def load(self, view, out):
        if self.optional and not view.has(self.up):
            return
        a = view.get(self.up)
        if a.shape[0] % len(self.refs):
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.up} has {a.shape[0]} rows, "
                             f"not divisible into {len(self.refs)} blocks ({', '.join(self.refs)})")
        for r, block in zip(self.refs, np.split(a, len(self.refs), axis=0)):
            out[r] = block.T if self.transpose else block

    def save(self, grads, out, used):
        if not all(r in grads for r in self.refs):
            return
        used.update(self.refs)
        out[self.up] = np.concatenate([_np(grads[r]).T if self.transpose else _np(grads[r]) for r in self.refs],
                                      axis=0)


@dataclass(frozen=True)
class _Rename:
    """One upstream name to one refattn key, transposed or not."""

    ref: str
    up: str
    transpose: bool
    optional: bool = False

    def load(self, view, out):
        if self.optional and not view.has(self.up):
            return
        a = view.get(self.up)
        out[self.ref] = a.T if self.transpose else a

    def save(self, grads, out, used):
        if self.ref in grads:
            used.add(self.ref)
            g = _np(grads[self.ref])
            out[self.up] = g.T if self.transpose else g


@dataclass(frozen=True)
class _Stack:
    """Per-head modules ``{base}.{i}.{leaf}`` for i = 0, 1, ... stacked into ``{base}.{leaf}``."""

    base: str
    leaf: str

    def load(self, view, out):
        n = 0
        while view.has(f"{self.base}.{n}.{self.leaf}"):
            n += 1
        if n:
            out[f"{self.base}.{self.leaf}"] = np.stack([view.get(f"{self.base}.{i}.{self.leaf}") for i in range(n)])

    def save(self, grads, out, used):
        key = f"{self.base}.{self.leaf}"
        if key in grads:
            used.add(key)
            for i, g in enumerate(_np(grads[key])):
                out[f"{self.base}.{i}.{self.leaf}"] = g


@dataclass(frozen=True)
class _Complex:
    """A complex weight ``up`` as ``{up}_real`` and ``{up}_imag``."""

    up: str
    optional: bool = False

    def load(self, view, out):
        if self.optional and not view.has(self.up):
            return
        a = view.get(self.up)
        if not np.iscomplexobj(a):
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.up} must be a complex "
                             f"tensor (torch.cfloat/cdouble, as upstream); got dtype {a.dtype}")
        out[f"{self.up}_real"], out[f"{self.up}_imag"] = a.real.copy(), a.imag.copy()

    def save(self, grads, out, used):
        r, i = f"{self.up}_real", f"{self.up}_imag"
        if r in grads and i in grads:
            used.update((r, i))
            out[self.up] = _np(grads[r]) + 1j * _np(grads[i])


@dataclass(frozen=True)
class _Reshape:
    """``up`` of shape ``up_shape(n)`` flattened to ``(n,)`` under the same name."""

    name: str
    up_shape: Callable
    optional: bool = False

    def load(self, view, out):
        if self.optional and not view.has(self.name):
            return
        out[self.name] = view.get(self.name).reshape(-1)

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            g = _np(grads[self.name])
            out[self.name] = g.reshape(self.up_shape(g.size))


# --------------------------------------------------------------------------------------------
# Input batteries: names -> sizes; each slug's builder draws inputs of those sizes for the module

MODULE_CASES = {
    "small": dict(b=2, n=5, m=7),
    "odd": dict(b=3, n=7, m=11),
    "one_token": dict(b=1, n=1, m=3),
    "long": dict(b=1, n=16, m=9),
}
"""The battery ``check_module`` runs: batch ``b``, query points ``n`` and key/context points
``m`` (cross-attention only). Grid operators map ``n`` to their grid (see each slug's builder)."""


@dataclass
class _Spec:
    slug: str
    upstream: str
    rules: list
    required: tuple = ()
    call: Callable = None
    """call(module, inputs (torch, refattn names), config (refattn)) -> output tensor"""
    build: Callable = None
    """build(rng, params, config, sizes) -> (inputs, extra config)"""
    attrs: dict = field(default_factory=dict)
    """refattn config keyword -> module attribute read by check_module (your config wins)"""
    unsupported: dict = field(default_factory=dict)
    """upstream key -> why refattn cannot take it"""
    infer: Callable = None
    """infer(state_dict keys) -> config the weights imply (check_module; your config wins)"""
    save_pick: Callable = None
    """save_pick(grads) -> the rules to use for the inverse map (when the load rules depend on keys)"""


_SPECS: dict[str, _Spec] = {}


def _spec(*specs: _Spec) -> None:
    for s in specs:
        _SPECS[s.slug] = s


# ---- torch.nn.MultiheadAttention


def _mha_fused(keys) -> bool:
    return "in_proj_weight" in keys


_MHA_TAIL = [_Split(("q_proj_bias", "k_proj_bias", "v_proj_bias"), "in_proj_bias", transpose=False, optional=True),
             _Rename("out_proj", "out_proj.weight", True), _Rename("out_proj_bias", "out_proj.bias", False, True),
             _Reshape("bias_k", lambda n: (1, 1, n), optional=True),  # add_bias_kv: (1, 1, E) -> (E,)
             _Reshape("bias_v", lambda n: (1, 1, n), optional=True)]
_MHA_FUSED = [_Split(("q_proj", "k_proj", "v_proj"), "in_proj_weight", transpose=True)] + _MHA_TAIL
_MHA_SEPARATE = [_Rename("q_proj", "q_proj_weight", True), _Rename("k_proj", "k_proj_weight", True),
                 _Rename("v_proj", "v_proj_weight", True)] + _MHA_TAIL


def _mha_call(module, inp, cfg):
    x = inp["x"]
    ctx = inp.get("context", x)
    val = inp.get("value", ctx)
    if not getattr(module, "batch_first", True):
        x, ctx, val = x.transpose(0, 1), ctx.transpose(0, 1), val.transpose(0, 1)
    out = module(x, ctx, val, need_weights=False)[0]
    return out if getattr(module, "batch_first", True) else out.transpose(0, 1)


def _mha_build(rng, p, cfg, z):
    c, ck, cv = p["q_proj"].shape[0], p["k_proj"].shape[0], p["v_proj"].shape[0]
    inp = {"x": rng.standard_normal((z["b"], z["n"], c))}
    if ck != c or cv != c or z.get("cross"):
        inp["context"] = rng.standard_normal((z["b"], z["m"], ck))
    if cv != ck:  # torch's vdim != kdim: a separate value input
        inp["value"] = rng.standard_normal((z["b"], z["m"], cv))
    return inp, {}


def _mha_save_pick(grads):
    q, k, v = (np.shape(grads.get(n, ())) for n in ("q_proj", "k_proj", "v_proj"))
    fused = len(q) == 2 and q[0] == k[0] == v[0]  # torch fuses iff kdim == vdim == embed_dim
    return _MHA_FUSED if fused else _MHA_SEPARATE


# ---- DIFF V1 / V2 / DiffCLIP: upstream names, Linear weights transposed


def _rope_for(cfg, n, d):
    """unilm's RoPE tables for ``n`` tokens, unless the caller's config sets ``rel_pos``."""
    if not (isinstance(cfg.get("rel_pos", "auto"), str) and cfg.get("rel_pos", "auto") == "auto"):
        return {}
    from ..attention.differential.layer import rope_tables

    return {"rel_pos": rope_tables(n, d)}


def _torch_rel_pos(cfg):
    rel = cfg.get("rel_pos")
    if rel is None:
        return None
    import torch

    return tuple(t if isinstance(t, torch.Tensor) else torch.from_numpy(np.asarray(t)) for t in rel)


def _diff_build(rng, p, cfg, z):
    c = p["q_proj.weight"].shape[0]
    d = p["q_proj.weight"].shape[1] // (2 * int(cfg["num_heads"]))
    return {"x": rng.standard_normal((z["b"], z["n"], c))}, _rope_for(cfg, z["n"], d)


def _x_build(key):
    def build(rng, p, cfg, z):
        return {"x": rng.standard_normal((z["b"], z["n"], p[key].shape[0]))}, {}
    return build


def _call_rel_pos(module, inp, cfg):
    return module(inp["x"], _torch_rel_pos(cfg))


def _call_x(module, inp, cfg):
    return module(inp["x"])


_LAMBDAS = _Named(r"lambda_[qk][12]", transpose=False)

# ---- Galerkin / Fourier SimpleAttention


def _galerkin_build(rng, p, cfg, z):
    c = p["linears.0.weight"].shape[0]
    inp = {"x": rng.standard_normal((z["b"], z["n"], c))}
    if "fc.weight" in p:  # upstream builds fc only for coordinates (pos_dim > 0)
        h = int(cfg["n_head"])
        npos = (p["fc.weight"].shape[0] - c) // h
        inp["pos"] = rng.uniform(0, 1, (z["b"], z["n"], npos))
    return inp, {}


def _galerkin_call(module, inp, cfg):
    x = inp["x"]
    return module(x, x, x, pos=inp.get("pos"))[0]


def _galerkin_rules(norms):
    return [_Named(r"linears\.[012]\.weight|fc\.weight", True), _Named(r"linears\.[012]\.bias|fc\.bias", False)] + [
        _Stack(f"norm_{t}", leaf) for t in norms for leaf in ("weight", "bias")]


# ---- Transolver, GNOT


def _transolver_rules(config):
    # Physics_Attention_Structured_Mesh_2D/3D (mesh_shape given): in_project_x/fx are Conv2d/3d,
    # whose kernels keep torch's layout (C_out, C_in, k...) in refattn
    conv = config.get("mesh_shape") is not None
    front = r"in_project_(x|fx)\.weight"
    return [_Named(front, not conv),
            _Named(r"in_project_slice\.weight|to_[qkv]\.weight|to_out\.0\.weight", True),
            _Named(r"in_project_(x|fx|slice)\.bias|to_out\.0\.bias", False),
            _Reshape("temperature", lambda n: (1, n, 1, 1))]


def _transolver_build(rng, p, cfg, z):
    mesh = cfg.get("mesh_shape")
    n = z["n"] if mesh is None else int(np.prod(mesh))
    c = p["in_project_x.weight"].shape[0 if mesh is None else 1]
    return {"x": rng.standard_normal((z["b"], n, c))}, {}


def _gnot_build(rng, p, cfg, z):
    c = p["query.weight"].shape[0]
    inp = {"x": rng.standard_normal((z["b"], z["n"], c))}
    if "keys.0.weight" in p:
        inp["y"] = rng.standard_normal((z["b"], z["m"], p["keys.0.weight"].shape[0]))
    return inp, {}


def _gnot_call(module, inp, cfg):
    if "y" in inp:
        return module(inp["x"], [inp["y"]])
    return module(inp["x"])


_LINEAR_NO_RULES = [
    _Named(r"in_project_x\.weight|to_[qkv]\.weight|to_out\.0\.weight", True),
    _Named(r"in_project_x\.bias|to_out\.0\.bias", False),
    _Reshape("temperature_q", lambda n: (1, n, 1, 1), optional=True),
    _Reshape("temperature_k", lambda n: (1, n, 1, 1), optional=True),
]


# ---- Set Transformer: SAB keeps MAB's names unprefixed in refattn (upstream SAB holds it as .mab)


def _set_rules(config):
    if config.get("block", "sab") == "sab":
        return [_Strip("mab.", r"fc_[qkvo]\.weight", True),
                _Strip("mab.", r"fc_[qkvo]\.bias|ln[01]\.(weight|bias)", False)]
    return [_Named(r"mab[01]?\.fc_[qkvo]\.weight", True),
            _Named(r"mab[01]?\.(fc_[qkvo]\.bias|ln[01]\.(weight|bias))|S|I", False)]


def _set_infer(keys):
    block = "isab" if "I" in keys else "pma" if "S" in keys else "sab"
    return {"block": block, "ln": any(".ln0." in k for k in keys)}


def _set_build(rng, p, cfg, z):
    key = next(k for k in ("fc_k.weight", "mab.fc_k.weight", "mab0.fc_k.weight") if k in p)
    return {"x": rng.standard_normal((z["b"], z["n"], p[key].shape[0]))}, {}


# ---- FNO spectral conv, AFNO


def _fno_build(rng, p, cfg, z):
    w = p["weights1_real"]
    m = w.shape[2:]
    # a grid with room for both corners on the full axis (2 m1 <= n1) and m2 <= n2 // 2 + 1
    grid = [2 * m[0] + z["n"] % 3] + [2 * mi + z["n"] % 2 for mi in m[1:]]
    return {"x": rng.standard_normal((z["b"], *grid, w.shape[0]))}, {}


def _fno_call(module, inp, cfg):
    x = inp["x"]
    nd = x.dim()
    y = module(x.movedim(-1, 1))  # upstream is channel-first (B, C, n1[, n2])
    return y.movedim(1, nd - 1)


def _afno_build(rng, p, cfg, z):
    c = p["w1"].shape[1] * p["w1"].shape[2]
    h = 4 + z["n"] % 3
    return {"x": rng.standard_normal((z["b"], h, h + 1, c))}, {}


_spec(
    _Spec("multi_head_attention", "PyTorch torch/nn/modules/activation.py (torch.nn.MultiheadAttention)",
          rules=None, call=_mha_call, build=_mha_build,
          attrs={"num_heads": "num_heads", "add_zero_attn": "add_zero_attn"}, save_pick=_mha_save_pick),
    _Spec("diff_attention_v1", "microsoft/unilm Diff-Transformer/multihead_diffattn.py@637157e (MultiheadDiffAttn; "
          "multihead_flashdiff_1.py with gqa_pairing='flash')",
          rules=[_Named(r"[qkv]_proj\.weight|out_proj\.weight", True), _LAMBDAS, _Named(r"subln\.weight", False)],
          required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "lambda_q1", "lambda_k1",
                    "lambda_q2", "lambda_k2"),
          call=_call_rel_pos, build=_diff_build,
          attrs={"num_heads": "num_heads", "num_kv_heads": "num_kv_heads", "lambda_init": "lambda_init"}),
    _Spec("diff_attention_v2", "microsoft/unilm Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py",
          rules=[_Named(r"[qkv]_proj\.weight|o_proj\.weight|lambda_proj\.weight", True)],
          required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "lambda_proj.weight"),
          call=_call_rel_pos, build=_diff_build, attrs={"num_heads": "num_heads", "num_kv_heads": "num_kv_heads"}),
    _Spec("diffclip_attention", "hammoudhasan/DiffCLIP diff_attention.py (DiffAttention)",
          rules=[_Named(r"[qkv]_proj\.weight|out_proj\.weight", True), _Named(r"[qkv]_proj\.bias|out_proj\.bias", False),
                 _LAMBDAS, _Named(r"diff_norm\.weight", False)],
          required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "out_proj.bias",
                    "lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"),
          call=_call_x, build=_x_build("q_proj.weight"), attrs={"num_heads": "num_heads"}),
    _Spec("galerkin_attention", "scaomath/galerkin-transformer libs/layers.py@2c9d23e (SimpleAttention, "
          "attention_type='galerkin')",
          rules=_galerkin_rules("KV"), required=("linears.0.weight", "linears.1.weight", "linears.2.weight"),
          call=_galerkin_call, build=_galerkin_build, attrs={"n_head": "n_head"}),
    _Spec("fourier_type_attention", "scaomath/galerkin-transformer libs/layers.py@2c9d23e (SimpleAttention, "
          "attention_type='fourier')",
          rules=_galerkin_rules("QK"), required=("linears.0.weight", "linears.1.weight", "linears.2.weight"),
          call=_galerkin_call, build=_galerkin_build, attrs={"n_head": "n_head"}),
    _Spec("transolver_physics_attention", "thuml/Transolver PDE-Solving-StandardBenchmark/model/Physics_Attention.py@1f53c15 "
          "(Physics_Attention_Irregular_Mesh; Structured_Mesh_2D/3D with mesh_shape=)",
          rules=_transolver_rules,
          required=("in_project_x.weight", "in_project_fx.weight", "in_project_slice.weight", "temperature",
                    "to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight"),
          call=_call_x, build=_transolver_build, attrs={"n_head": "heads"}),
    _Spec("gnot_hna_attention", "HaoZhongkai/GNOT models/cgpt.py@5df0390 (LinearAttention, LinearCrossAttention)",
          rules=[_Named(r"(query|key|value|proj|keys\.\d+|values\.\d+)\.weight", True),
                 _Named(r"(query|key|value|proj|keys\.\d+|values\.\d+)\.bias", False)],
          required=("query.weight", "proj.weight"),
          call=_gnot_call, build=_gnot_build, attrs={"n_head": "n_head"}),
    _Spec("linear_no_attention", "HiPRL/LinearNO Standard_PDE_Benchmark/model/LinearAttnNeuralOperator.py@3f2b80d "
          "(LinearNO, LinearNO_temp)",
          rules=_LINEAR_NO_RULES,
          required=("in_project_x.weight", "to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight"),
          call=_call_x, build=_x_build("in_project_x.weight"), attrs={"n_head": "heads"}),
    _Spec("set_transformer_blocks", "juho-lee/set_transformer modules.py (SAB, ISAB, PMA; block= says which)",
          rules=_set_rules, call=_call_x, build=_set_build, infer=_set_infer,
          attrs={"num_heads": ("mab.num_heads", "mab0.num_heads")}),
    _Spec("fno_spectral_conv", "zongyi-li/fourier_neural_operator fourier_1d.py / fourier_2d.py@4ed7737 "
          "(SpectralConv1d, SpectralConv2d)",
          rules=[_Complex("weights1"), _Complex("weights2", optional=True)], required=("weights1",),
          call=_fno_call, build=_fno_build),
    _Spec("afno_dpot_fourier_mixer", "NVlabs/AFNO-transformer afno/afno2d.py@c3271a2 (AFNO2D); thu-ml/DPOT models/dpot.py "
          "(AFNO2D, channel-last input)",
          rules=[_Named(r"[wb][12]", False)], required=("w1", "b1", "w2", "b2"),
          call=_call_x, build=_afno_build, attrs={"num_blocks": "num_blocks",
                                                   "hard_thresholding_fraction": "hard_thresholding_fraction"}),
)


# --------------------------------------------------------------------------------------------
# Public API


def supported_slugs() -> dict[str, str]:
    """``{slug: upstream module}`` for every mechanism ``params_from_state_dict`` maps."""
    return {s: spec.upstream for s, spec in _SPECS.items()}


def _get_spec(slug) -> _Spec:
    if not isinstance(slug, str):
        raise TypeError(f"slug must be a registry slug (str); got {type(slug).__name__}")
    if slug in _SPECS:
        return _SPECS[slug]
    try:
        rec = registry.get(slug)
    except registry.UnknownMechanism as exc:
        raise ValueError(f"refattn.interop.torch: {exc}") from None
    code = (rec.official_code or "").strip()
    why = ("the catalogue names no official PyTorch code for it" if not code or code.startswith(("—", "-"))
           else f"its official code ({code}) has no state_dict table here yet")
    raise ValueError(f"refattn.interop.torch has no state_dict mapping for {rec.slug!r}: {why} "
                     f"(refattn.interop.coverage.torch_coverage() lists every mechanism). Mapped slugs: "
                     f"{', '.join(_SPECS)}. Build its params by hand (weights (in, out) = torch weight.T) "
                     f"and check them with refattn.testing.compare_implementation.")


def _check_config(spec: _Spec, config: dict) -> None:
    rec = registry.get(spec.slug)
    sig = inspect.signature(rec.forward)
    allowed = {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise TypeError(f"{spec.slug}: unknown config keywords {unknown}; {rec.forward.__name__} takes "
                        f"{sorted(allowed)}")


def _load_rules(spec: _Spec, keys, config) -> list:
    if spec.slug == "multi_head_attention":
        return _MHA_FUSED if _mha_fused(keys) else _MHA_SEPARATE
    return spec.rules(config) if callable(spec.rules) else spec.rules


def params_from_state_dict(slug: str, state_dict: Mapping, *, prefix: str = "", strict: bool = True,
                           dtype=None, **config) -> dict[str, np.ndarray]:
    """refattn params for mechanism ``slug`` from an upstream PyTorch ``state_dict``.

    Parameters
    ----------
    slug
        A slug of :func:`supported_slugs`.
    state_dict
        ``module.state_dict()`` (torch tensors, any device) or a dict of NumPy arrays.
    prefix
        Where the layer sits in a bigger model, e.g. ``"layers.3.attn."``: only keys starting
        with it are read, and it is stripped.
    strict
        Raise if a key under ``prefix`` has no counterpart in refattn (default; a key the table
        does not know is a sign of an upstream option refattn does not implement).
    dtype
        Cast every array to this dtype (default: keep the state_dict's).
    **config
        The mechanism's config keywords (checked against its forward's signature).

    Returns
    -------
    dict
        refattn params (``Linear`` weights ``(in, out)``), NumPy arrays.

    Raises
    ------
    ValueError
        A slug without mapping (the message says so), a missing key (named, with its prefix), a
        key refattn has no counterpart for (``strict``), a fused weight that does not split.
    """
    spec = _get_spec(slug)
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors; got {type(state_dict).__name__}")
    _check_config(spec, config)
    view = _View(state_dict, prefix, spec.slug)
    if not view.items:
        raise ValueError(f"params_from_state_dict[{spec.slug}]: no key starts with prefix {prefix!r}; "
                         f"first keys: {sorted(state_dict)[:8]}")
    for name in spec.required:
        view.require(name)  # a missing required key is named here, before anything else
    out: dict = {}
    for rule in _load_rules(spec, view.items, config):
        rule.load(view, out)
    left = sorted(set(view.items) - view.used)
    if strict and left:
        why = [f"{prefix + k} ({spec.unsupported[k]})" for k in left if k in spec.unsupported]
        raise ValueError(f"params_from_state_dict[{spec.slug}]: keys with no counterpart in refattn: "
                         + "; ".join(why + [prefix + k for k in left if k not in spec.unsupported])
                         + " (strict=False ignores them)")
    if dtype is not None:
        out = {k: v.astype(dtype) for k, v in out.items()}
    return out


def grads_to_state_dict(slug: str, grads: Mapping, *, prefix: str = "", **config) -> dict[str, np.ndarray]:
    """The inverse map on gradients: refattn's ``{param: grad}`` under the upstream names.

    ``grads`` may be the whole dict a backward returns: input gradients (``x`` …) are left out.
    Returns NumPy arrays keyed ``prefix + upstream name`` (complex for a complex upstream weight),
    e.g. for ``p.grad = torch.from_numpy(g[name])``.
    """
    spec = _get_spec(slug)
    if not isinstance(grads, Mapping):
        raise TypeError(f"grads must be a dict of gradients; got {type(grads).__name__}")
    _check_config(spec, config)
    if spec.save_pick is not None:
        rules = spec.save_pick(grads)
    else:
        rules = spec.rules(config) if callable(spec.rules) else spec.rules
    out: dict = {}
    used: set = set()
    for rule in rules:
        rule.save(dict(grads), out, used)
    return {prefix + k: v for k, v in out.items()}


def _torch_dtype(torch, dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    return {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}[np.dtype(dtype)]


def _attr_path(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


def _to_torch(torch, a, tdt):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(tdt) if t.is_floating_point() else t


def check_module(module, slug: str, *, config: dict | None = None, cases: Sequence[str] | None = None,
                 seeds: Sequence[int] = (0, 1), dtype=None, call: Callable | None = None,
                 rtol: float | None = None, atol: float | None = None) -> CompareReport:
    """Run your ``nn.Module`` and refattn side by side: forward, every input and parameter gradient.

    A copy of ``module`` (cast to ``dtype``, in ``eval()`` mode) runs on each case of
    :data:`MODULE_CASES` (inputs drawn for the module's widths); refattn runs on the same inputs
    with ``params_from_state_dict(slug, module.state_dict())``. The module's parameter gradients
    are mapped by the same table, so a wrong transpose, split or head order shows as a failing
    parameter gradient, named as refattn names it.

    Parameters
    ----------
    module
        A ``torch.nn.Module`` computing mechanism ``slug`` with upstream parameter names.
    slug
        A slug of :func:`supported_slugs`.
    config
        refattn config keywords (e.g. ``{"gqa_pairing": "flash"}``); the head counts are read from
        the module's attributes (``num_heads``, ``n_head`` …) when absent. For DIFF V1/V2 the RoPE
        tables are built per case (``rel_pos=None`` turns RoPE off) and passed to
        ``module(x, rel_pos)``, unilm's signature.
    cases, seeds
        Names of :data:`MODULE_CASES` (default all, plus ``cross`` for ``nn.MultiheadAttention``)
        and seeds (default ``(0, 1)``).
    dtype
        ``torch.float64`` (default) or ``torch.float32`` (then the float32 rule of
        :func:`~refattn.testing.compare_implementation` applies).
    call
        ``call(module, inputs, config) -> output``: how to call the module with refattn's inputs
        (torch tensors under refattn's names); default: the upstream signature of the slug.
    rtol, atol
        Replace the dtype rule by an entry-wise bound.

    Returns
    -------
    CompareReport
        As from :func:`~refattn.testing.compare_implementation`; ``print(report)`` for the table.
    """
    import torch

    spec = _get_spec(slug)
    rec = registry.get(spec.slug)
    tdt = _torch_dtype(torch, torch.float64 if dtype is None else dtype)
    np_dt = np.float64 if tdt == torch.float64 else np.float32
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
    m = copy.deepcopy(module).eval()
    cdt = torch.complex128 if tdt == torch.float64 else torch.complex64
    with torch.no_grad():  # Module.to(float64) would drop the imaginary part of complex weights
        for t in list(m.parameters()) + list(m.buffers()):
            if t.is_complex() or t.is_floating_point():
                t.data = t.data.to(cdt if t.is_complex() else tdt)
    cfg = dict(config or {})
    for kw, paths in spec.attrs.items():
        for path in (paths,) if isinstance(paths, str) else paths:
            val = _attr_path(m, path)
            if kw not in cfg and isinstance(val, (int, float)):
                cfg[kw] = val
    if spec.infer is not None:
        for kw, val in spec.infer(m.state_dict().keys()).items():
            cfg.setdefault(kw, val)
    sig = inspect.signature(rec.forward).parameters
    needed = [n for n, q in sig.items() if q.kind is q.KEYWORD_ONLY and q.default is q.empty and n not in cfg]
    if needed:
        hint = {kw: attr for kw, attr in spec.attrs.items() if kw in needed}
        raise ValueError(f"check_module[{spec.slug}]: config must give {needed}"
                         + (f" (read from the module's attributes {hint} when it has them)" if hint else ""))
    base_cfg = {k: v for k, v in cfg.items() if k != "rel_pos"}
    params = params_from_state_dict(spec.slug, m.state_dict(), **base_cfg)
    params = {k: v.astype(np.float64) for k, v in params.items()}
    names_avail = dict(MODULE_CASES)
    if spec.slug == "multi_head_attention":
        names_avail["cross"] = dict(b=2, n=4, m=9, cross=True)
    names = list(names_avail) if cases is None else [cases] if isinstance(cases, str) else list(cases)
    unknown = [c for c in names if c not in names_avail]
    if unknown:
        raise ValueError(f"check_module: unknown cases {unknown}; the cases are {list(names_avail)}")
    call = call or spec.call

    report = CompareReport(spec.slug, vjp_given=True)
    for case in names:
        for seed in seeds:
            rng = np.random.default_rng([int(seed), names.index(case)])
            inputs, extra = spec.build(rng, params, cfg, names_avail[case])
            run_cfg = {**base_cfg, **extra}
            if "rel_pos" in cfg and not isinstance(cfg["rel_pos"], str):
                run_cfg["rel_pos"] = cfg["rel_pos"]  # None (no RoPE) or your own tables
            smp = Sample(inputs=inputs, params=params, config=run_cfg)
            r = _module_run(torch, m, rec, spec, call, smp, int(seed), tdt, np_dt, rtol, atol)
            for res in r.results:
                res.case, res.seed = case, int(seed)
            report.results += r.results
            report.grads_compared = r.grads_compared
            report.rules.update(r.rules)
    return report


def _module_run(torch, m, rec, spec, call, smp: Sample, seed, tdt, np_dt, rtol, atol) -> CompareReport:
    """One input draw: the module's forward and autograd VJP against refattn's."""
    inputs, params, run_cfg = smp.inputs, smp.params, smp.config
    out, cache = registry.call_forward(rec, inputs, params, run_cfg)
    diff_inputs = [k for k in inputs if k in rec.backward(np.ones_like(out), cache)]
    named_params = dict(m.named_parameters())

    def fn(**kw):
        with torch.no_grad():
            return call(m, {k: kw[k] for k in inputs}, run_cfg)

    def vjp(dout, **kw):
        xs = {k: kw[k].detach().clone().requires_grad_(k in diff_inputs) for k in inputs}
        y = call(m, xs, run_cfg)
        wrt = [xs[k] for k in diff_inputs] + list(named_params.values())
        gs = torch.autograd.grad(y, wrt, dout, allow_unused=True)
        res = {k: g for k, g in zip(diff_inputs, gs[:len(diff_inputs)]) if g is not None}
        sd = {n: (torch.zeros_like(p) if g is None else g)
              for (n, p), g in zip(named_params.items(), gs[len(diff_inputs):])}
        # buffers carry no gradient; the table only reads the keys it maps
        sd.update({n: torch.zeros_like(b) for n, b in m.named_buffers() if n not in sd})
        res.update(params_from_state_dict(spec.slug, sd, strict=False, **run_cfg))
        return res

    return compare_implementation(fn, rec, vjp=vjp, sample=smp, seed=seed, dtype=np_dt,
                                  convert=lambda a: _to_torch(torch, a, tdt), rtol=rtol, atol=atol)
