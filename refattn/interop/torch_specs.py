r"""The per-slug table of :mod:`refattn.interop.torch`: rules, input builders, call conventions.

One :class:`Spec` per mapped mechanism: the rules that map an upstream PyTorch ``state_dict`` to
refattn's params (and, read backwards, gradients to the upstream names; see the rule list in
:mod:`refattn.interop.torch`), the input builder ``check_module`` draws each case of
:data:`MODULE_CASES` with, and how the upstream module is called. A slug's rules, builder and call
are written and reviewed together, here; the functions that read the table
(``params_from_state_dict``, ``grads_to_state_dict``, ``check_module``) live in
:mod:`refattn.interop.torch`.

No framework is imported at module level: the few call helpers that need torch import it inside.

Further rows live in :mod:`refattn.interop.torch_specs_layers` (the full layers, ``"slug:layer"``)
and :mod:`refattn.interop.torch_specs_extra`; they build on the public rule names (``Named``,
``Rename``, ``Reshape``, ``Derived``) and helpers (``x_build``, ``call_x``) exported here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..testing.compare import to_numpy

__all__ = ["View", "Spec", "SPECS", "MODULE_CASES", "add_specs", "load_rules", "Named", "Rename", "Reshape",
           "Derived", "Split", "Stack", "Complex", "Strip", "Reprefix", "x_build", "call_x"]

# --------------------------------------------------------------------------------------------
# Rules: one upstream name (or name family) <-> one refattn params key


_np = to_numpy  # torch tensors (any device) or NumPy arrays to NumPy


class View:
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

    def load(self, view: View, out: dict) -> None:
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

    def load(self, view: View, out: dict) -> None:
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
    """A complex weight ``up`` as ``{ref}_real`` and ``{ref}_imag`` (``ref`` defaults to ``up``)."""

    up: str
    optional: bool = False
    ref: str = ""

    def load(self, view, out):
        if self.optional and not view.has(self.up):
            return
        a = view.get(self.up)
        if not np.iscomplexobj(a):
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.up} must be a complex "
                             f"tensor (torch.cfloat/cdouble, as upstream); got dtype {a.dtype}")
        base = self.ref or self.up
        out[f"{base}_real"], out[f"{base}_imag"] = a.real.copy(), a.imag.copy()

    def save(self, grads, out, used):
        r, i = f"{self.ref or self.up}_real", f"{self.ref or self.up}_imag"
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


@dataclass(frozen=True)
class _Reprefix:
    """Upstream ``up + rest`` to refattn ``ref + rest`` for ``rest`` matching ``pattern`` (CRATE's
    ``0.``/``1.`` sub-modules of one layer are refattn's ``attn.``/``ff.``)."""

    up: str
    ref: str
    pattern: str
    transpose: bool

    def load(self, view, out):
        for name in sorted(view.items):
            rest = name[len(self.up):]
            if name not in view.used and name.startswith(self.up) and re.fullmatch(self.pattern, rest):
                a = view.get(name)
                out[self.ref + rest] = a.T if self.transpose else a

    def save(self, grads, out, used):
        for name in list(grads):
            rest = name[len(self.ref):]
            if name not in used and name.startswith(self.ref) and re.fullmatch(self.pattern, rest):
                used.add(name)
                g = _np(grads[name])
                out[self.up + rest] = g.T if self.transpose else g


@dataclass(frozen=True)
class _Derived:
    """Buffers upstream derives from the config (e.g. Swin's ``relative_position_index``): read and
    dropped, since refattn rebuilds them from the same config; no gradient to map back."""

    pattern: str

    def load(self, view, out):
        for name in sorted(view.items):
            if name not in view.used and re.fullmatch(self.pattern, name):
                view.used.add(name)

    def save(self, grads, out, used):
        pass


Named, Rename, Reshape, Derived = _Named, _Rename, _Reshape, _Derived
Split, Stack, Complex, Strip, Reprefix = _Split, _Stack, _Complex, _Strip, _Reprefix
"""Public names of the rule classes, for the tables kept in the ``torch_specs_<group>`` modules."""


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
class Spec:
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
    defaults: dict = field(default_factory=dict)
    """config check_module uses unless yours sets it: the upstream module's convention"""
    module_prefix: str = ""
    """where check_module finds the layer in the module it is given (e.g. ``layers.0.``)"""
    infer: Callable = None
    """infer(state_dict keys) -> config the weights imply (check_module; your config wins)"""
    save_pick: Callable = None
    """save_pick(grads) -> the rules to use for the inverse map (when the load rules depend on keys)"""
    load_pick: Callable = None
    """load_pick(state_dict keys) -> the rules to load with (when the upstream layout shows in the keys)"""
    layer: tuple = None
    """``(forward, backward)`` of the full layer the upstream module is, when the record's forward is
    a core on ``(q, k, v)``: the spec is then keyed ``"{slug}:{variant}"`` and maps the layer's params"""
    variant: str = "layer"
    """the suffix of a ``layer`` spec's key: ``"layer"``, or what the function pair is (``"model"``,
    ``"neuralop"`` ...)"""
    kw_inputs: tuple = ()
    """keyword-only arguments of the forward that ``build`` draws as (differentiable) inputs"""
    build_keys: tuple = ()
    """config keywords ``build`` reads that are not the forward's (e.g. ``cross=True``): accepted by
    ``check_module`` and ``params_from_state_dict``, never passed to the forward"""

    @property
    def key(self) -> str:
        """The name :func:`refattn.interop.torch.supported_slugs` lists: the slug, or ``slug:variant``."""
        return f"{self.slug}:{self.variant}" if self.layer is not None else self.slug


SPECS: dict[str, Spec] = {}


def add_specs(*specs: Spec) -> None:
    for s in specs:
        if s.key in SPECS:
            raise ValueError(f"add_specs: {s.key!r} is already in the table ({SPECS[s.key].upstream})")
        SPECS[s.key] = s


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


# ---- HF LLaMA-style GQA / MQA (q_proj/k_proj/v_proj/o_proj, repeat_kv = the "contiguous" group map)

_LLAMA_RULES = [_Rename(f"{t}_proj", f"{t}_proj.weight", True) for t in "qkv"] + [
    _Rename(f"{t}_proj_bias", f"{t}_proj.bias", False, optional=True) for t in "qkv"] + [
    _Rename("out_proj", "o_proj.weight", True), _Rename("out_proj_bias", "o_proj.bias", False, optional=True)]

_LLAMA_CALL_KEYS = ("num_heads", "num_kv_heads", "is_causal", "rope", "kv_group_map", "scale")


def _llama_call(module, inp, cfg):
    """HF ``LlamaAttention.forward(hidden_states, position_embeddings, attention_mask)`` (transformers
    >= 4.48): the ``(cos, sin)`` tables of ``LlamaRotaryEmbedding`` (rotate-half layout, ``(b, n, d)``)
    built from refattn's ``rope`` (None: cos 1, sin 0, an exact identity) and, with ``is_causal``,
    the additive causal mask at ``finfo.min`` that HF's models build. Older HF signatures
    (``position_ids=``) need your own ``call=``."""
    import torch

    other = sorted(k for k, v in cfg.items() if k not in _LLAMA_CALL_KEYS and v is not None and v is not False)
    if other or cfg.get("kv_group_map", "contiguous") != "contiguous":
        raise ValueError(f"check_module[gqa_mqa]: the HF LlamaAttention call takes num_heads, num_kv_heads, "
                         f"is_causal, rope (base, offset) and scale; {other or ['kv_group_map']} need your own call=")
    x = inp["x"]
    b, n, _ = x.shape
    d = module.q_proj.weight.shape[0] // int(cfg["num_heads"])
    rope = cfg.get("rope")
    if rope is None or rope is False:
        cos, sin = torch.ones(b, n, d, dtype=x.dtype), torch.zeros(b, n, d, dtype=x.dtype)
    else:
        rope = {} if rope is True else dict(rope)
        bad = sorted(set(rope) - {"base", "offset"})
        if bad:
            raise ValueError(f"check_module[gqa_mqa]: HF's rotary tables take rope base and offset; {bad} need "
                             "your own call=")
        inv = 1.0 / float(rope.get("base", 10000.0)) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        freqs = (torch.arange(n, dtype=torch.float64) + int(rope.get("offset", 0)))[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)[None].expand(b, n, d)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    mask = None
    if cfg.get("is_causal"):
        mask = torch.full((n, n), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None].expand(b, 1, n, n)
    out = module(x, position_embeddings=(cos, sin), attention_mask=mask)
    return out[0] if isinstance(out, tuple) else out


def _llama_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], z["n"], p["q_proj"].shape[0]))}, {}


# ---- PhysicsNeMo GALE (GeoTransolver): PhysicsAttentionIrregularMesh + cross-attention to a context


def _gale_infer(keys):
    return {"state_mixing_mode": "concat_project" if "concat_project.0.weight" in keys else "weighted"}


def _gale_build(rng, p, cfg, z):
    inp = {"x": rng.standard_normal((z["b"], z["n"], p["in_project_x.weight"].shape[0]))}
    if "cross_k.weight" in p:  # the context (B, H, S_c, D_c), built upstream by ContextProjector
        inp["context"] = rng.standard_normal((z["b"], int(cfg["n_head"]), z["m"], p["cross_k.weight"].shape[0]))
    return inp, {}


def _gale_call(module, inp, cfg):
    return module((inp["x"],), inp.get("context"))[0]  # upstream takes a tuple of inputs, returns a list


# ---- Poseidon scOT layer (a Swin-V2 layer with time-conditioned LayerNorms; HF Swinv2 names)


def _scot_build(rng, p, cfg, z):
    ws = int(cfg["window_size"])  # a grid of about 2 x 2 windows, padded on one axis
    c = p["attention.self.query.weight"].shape[0]
    h, w = 2 * ws + z["n"] % 2, 2 * ws + 1 - z["n"] % 2
    return {"x": rng.standard_normal((z["b"], h, w, c)), "t": rng.uniform(0, 1, z["b"])}, {}


def _scot_call(module, inp, cfg):
    x = inp["x"]  # upstream: hidden states (B, H W, C), input_dimensions (H, W), time (B,); returns a tuple
    b, h, w, c = x.shape
    return module(x.reshape(b, h * w, c), (h, w), inp["t"])[0].reshape(b, h, w, c)


# ---- CaiT class-attention block (LayerScale_Block_CA with Class_Attention)


def _cait_build(rng, p, cfg, z):
    c = p["attn.q.weight"].shape[0]
    return {"x": rng.standard_normal((z["b"], z["n"], c)), "x_cls": rng.standard_normal((z["b"], 1, c))}, {}


def _cait_call(module, inp, cfg):
    return module(inp["x"], inp["x_cls"])


# ---- CRATE: one layer of Transformer.layers (0. = PreNorm(Attention), 1. = PreNorm(FeedForward))


def _crate_build(rng, p, cfg, z):
    return {"z": rng.standard_normal((z["b"], z["n"], p["attn.fn.qkv.weight"].shape[0]))}, {}


def _crate_call(module, inp, cfg):
    return module(inp["z"])


# ---- Transposed channel attention: Restormer's MDTA (conv; kernels keep torch's layout) or XCiT's XCA (Linear)

_MDTA_RULES = [_Named(r"(qkv|qkv_dwconv|project_out)\.(weight|bias)|temperature", False)]
_XCA_RULES = [_Named(r"(qkv|proj)\.weight", True), _Named(r"(qkv|proj)\.bias|temperature", False)]


def _channel_pick(keys):
    return _XCA_RULES if "proj.weight" in keys else _MDTA_RULES


def _channel_infer(keys):
    return {"projection": "linear" if "proj.weight" in keys else "conv"}


def _channel_build(rng, p, cfg, z):
    if p["qkv.weight"].ndim == 2:  # XCA: tokens (B, N, C)
        return {"x": rng.standard_normal((z["b"], z["n"], p["qkv.weight"].shape[0]))}, {}
    h, w = 2 + z["n"] % 4, 3 + z["n"] % 3
    return {"x": rng.standard_normal((z["b"], p["qkv.weight"].shape[1], h, w))}, {}


add_specs(
    Spec("multi_head_attention", "PyTorch torch/nn/modules/activation.py (torch.nn.MultiheadAttention)",
          rules=None, call=_mha_call, build=_mha_build,
          attrs={"num_heads": "num_heads", "add_zero_attn": "add_zero_attn"}, save_pick=_mha_save_pick),
    Spec("gqa_mqa", "huggingface/transformers src/transformers/models/llama/modeling_llama.py@5dd4a63 "
         "(LlamaAttention: q_proj/k_proj/v_proj/o_proj, repeat_kv, eager_attention_forward)",
         rules=_LLAMA_RULES, required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"),
         call=_llama_call, build=_llama_build,
         attrs={"num_heads": ("num_heads", "config.num_attention_heads"),
                "num_kv_heads": ("num_key_value_heads", "config.num_key_value_heads")}),
    Spec("diff_attention_v1", "microsoft/unilm Diff-Transformer/multihead_diffattn.py@637157e (MultiheadDiffAttn; "
          "multihead_flashdiff_1.py with gqa_pairing='flash')",
          rules=[_Named(r"[qkv]_proj\.weight|out_proj\.weight", True), _LAMBDAS, _Named(r"subln\.weight", False)],
          required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "lambda_q1", "lambda_k1",
                    "lambda_q2", "lambda_k2"),
          call=_call_rel_pos, build=_diff_build,
          attrs={"num_heads": "num_heads", "num_kv_heads": "num_kv_heads", "lambda_init": "lambda_init"}),
    Spec("diff_attention_v2", "microsoft/unilm Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py",
          rules=[_Named(r"[qkv]_proj\.weight|o_proj\.weight|lambda_proj\.weight", True)],
          required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "lambda_proj.weight"),
          call=_call_rel_pos, build=_diff_build, attrs={"num_heads": "num_heads", "num_kv_heads": "num_kv_heads"}),
    Spec("diffclip_attention", "hammoudhasan/DiffCLIP diff_attention.py (DiffAttention)",
          rules=[_Named(r"[qkv]_proj\.weight|out_proj\.weight", True), _Named(r"[qkv]_proj\.bias|out_proj\.bias", False),
                 _LAMBDAS, _Named(r"diff_norm\.weight", False)],
          required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "out_proj.bias",
                    "lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"),
          call=_call_x, build=_x_build("q_proj.weight"), attrs={"num_heads": "num_heads"}),
    Spec("class_attention", "facebookresearch/deit cait_models.py@0176669 (LayerScale_Block_CA with Class_Attention, "
         "timm Mlp)",
         rules=[_Named(r"attn\.([qkv]|proj)\.weight|mlp\.fc[12]\.weight", True),
                _Named(r"norm[12]\.(weight|bias)|attn\.([qkv]|proj)\.bias|mlp\.fc[12]\.bias|gamma_[12]", False)],
         required=("attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.proj.weight", "gamma_1", "gamma_2"),
         call=_cait_call, build=_cait_build,
         attrs={"num_heads": "attn.num_heads", "scale": "attn.scale", "eps": "norm1.eps"}),
    Spec("crate_mssa_ista", "Ma-Lab-Berkeley/CRATE model/crate.py@0227249 (one layer of Transformer: "
         "PreNorm(Attention), PreNorm(FeedForward); prefix='layers.{i}.')",
         rules=[_Reprefix("0.", "attn.", r"fn\.qkv\.weight|fn\.to_out\.0\.weight", True),
                _Reprefix("0.", "attn.", r"norm\.(weight|bias)|fn\.to_out\.0\.bias", False),
                _Reprefix("1.", "ff.", r"norm\.(weight|bias)|fn\.weight", False)],
         required=("0.fn.qkv.weight", "1.fn.weight"), call=_crate_call, build=_crate_build,
         module_prefix="layers.0.",
         attrs={"num_heads": "heads", "scale": "layers.0.0.fn.scale", "step_size": "layers.0.1.fn.step_size",
                "lambd": "layers.0.1.fn.lambd"}),
    Spec("transposed_channel_attention", "swz30/Restormer basicsr/models/archs/restormer_arch.py@861974a (Attention, "
         "MDTA: projection='conv'); facebookresearch/xcit xcit.py@9a7df94 (XCA: projection='linear')",
         rules=_MDTA_RULES, required=("qkv.weight", "temperature"), load_pick=_channel_pick,
         save_pick=_channel_pick, call=_call_x, build=_channel_build,
         attrs={"num_heads": "num_heads"}, infer=_channel_infer),
    Spec("transolver_physics_attention", "thuml/Transolver PDE-Solving-StandardBenchmark/model/Physics_Attention.py@1f53c15 "
          "(Physics_Attention_Irregular_Mesh; Structured_Mesh_2D/3D with mesh_shape=)",
          rules=_transolver_rules,
          required=("in_project_x.weight", "in_project_fx.weight", "in_project_slice.weight", "temperature",
                    "to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight"),
          call=_call_x, build=_transolver_build, attrs={"n_head": "heads"}),
    Spec("geotransolver_gale", "NVIDIA/physicsnemo physicsnemo/nn/module/gale.py@17505d6 (GALE, use_te=False, "
         "plus=False) on physics_attention.py (PhysicsAttentionIrregularMesh)",
         rules=[_Named(r"(in_project_(x|fx|slice)|qkv_project|out_linear|cross_[qkv]|concat_project\.0)\.weight", True),
                _Named(r"(in_project_(x|fx|slice)|out_linear|cross_[qkv]|concat_project\.0)\.bias|state_mixing", False),
                _Reshape("temperature", lambda n: (1, 1, n, 1))],
         required=("in_project_x.weight", "in_project_fx.weight", "in_project_slice.weight", "temperature",
                   "qkv_project.weight", "out_linear.weight"),
         call=_gale_call, build=_gale_build, infer=_gale_infer, attrs={"n_head": "heads"},
         unsupported={"proj_temperature.0.weight": "Transolver++ (plus=True) is not implemented"}),
    Spec("gnot_hna_attention", "HaoZhongkai/GNOT models/cgpt.py@5df0390 (LinearAttention, LinearCrossAttention)",
          rules=[_Named(r"(query|key|value|proj|keys\.\d+|values\.\d+)\.weight", True),
                 _Named(r"(query|key|value|proj|keys\.\d+|values\.\d+)\.bias", False)],
          required=("query.weight", "proj.weight"),
          call=_gnot_call, build=_gnot_build, attrs={"n_head": "n_head"}),
    Spec("linear_no_attention", "HiPRL/LinearNO Standard_PDE_Benchmark/model/LinearAttnNeuralOperator.py@3f2b80d "
          "(LinearNO, LinearNO_temp)",
          rules=_LINEAR_NO_RULES,
          required=("in_project_x.weight", "to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight"),
          call=_call_x, build=_x_build("in_project_x.weight"), attrs={"n_head": "heads"}),
    Spec("set_transformer_blocks", "juho-lee/set_transformer modules.py (SAB, ISAB, PMA; block= says which)",
          rules=_set_rules, call=_call_x, build=_set_build, infer=_set_infer,
          attrs={"num_heads": ("mab.num_heads", "mab0.num_heads")}),
    Spec("scot_poseidon_block", "camlab-ethz/poseidon scOT/model.py@b8fa28f (ScOTLayer, ConditionalLayerNorm) on "
         "transformers' Swinv2SelfAttention (attention.self.*)",
         rules=[_Derived(r"attention\.self\.relative_(coords_table|position_index)"),
                _Named(r".*\.weight", True), _Named(r".*\.bias|attention\.self\.logit_scale", False)],
         required=("attention.self.query.weight", "attention.self.logit_scale", "layernorm_before.weight.weight"),
         call=_scot_call, build=_scot_build,
         attrs={"num_heads": "attention.self.num_attention_heads", "window_size": "window_size",
                "shift_size": "shift_size"}),
    Spec("fno_spectral_conv", "zongyi-li/fourier_neural_operator fourier_1d.py / fourier_2d.py@4ed7737 "
          "(SpectralConv1d, SpectralConv2d)",
          rules=[_Complex("weights1"), _Complex("weights2", optional=True)], required=("weights1",),
          call=_fno_call, build=_fno_build),
    Spec("afno_dpot_fourier_mixer", "NVlabs/AFNO-transformer afno/afno2d.py@c3271a2 (AFNO2D); thu-ml/DPOT models/dpot.py "
          "(AFNO2D, channel-last input)",
          rules=[_Named(r"[wb][12]", False)], required=("w1", "b1", "w2", "b2"),
          call=_call_x, build=_afno_build, attrs={"num_blocks": "num_blocks",
                                                   "hard_thresholding_fraction": "hard_thresholding_fraction"}),
)




def load_rules(spec: Spec, keys, config) -> list:
    if spec.key == "multi_head_attention":
        return _MHA_FUSED if _mha_fused(keys) else _MHA_SEPARATE
    if spec.load_pick is not None:
        return spec.load_pick(keys)
    return spec.rules(config) if callable(spec.rules) else spec.rules


x_build, call_x = _x_build, _call_x  # public names for the other table modules (torch_specs_layers, _extra)
