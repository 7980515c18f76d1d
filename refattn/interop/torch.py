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
other slug raises ``ValueError`` with the reason :mod:`refattn.interop.unmapped` gives (no weights,
no PyTorch module, code not readable) or saying that its table is not written yet. A mechanism
without weights (``sdpa``, ``rope`` …) maps an empty ``state_dict`` to ``{}``.

The table's rows live in :mod:`refattn.interop.torch_specs` and in every sibling module named
``torch_specs_<group>`` (imported here, each registering its rows with ``add_specs``).

Full layers: ``"slug:layer"``
-----------------------------
Some records' forward is a core on ``(q, k, v)`` while the upstream module is the full layer
(projections, positions, norms, gates), which refattn implements as a separate function pair, e.g.
``multi_token_attention_layer_forward/backward``. Such a mechanism is mapped under the name
``"slug:layer"`` (a spec with ``layer=(forward, backward)`` in the table): the same three functions
then read, map and check the layer's params, e.g. ``check_module(module, "alibi:layer", config=...)``
or ``params_from_state_dict("multi_token_attention:layer", sd)``; ``config`` takes the layer
function's keywords. Where the upstream module is another function pair of the mechanism's module
than a layer (IPOT's whole model, FactFormer's ``LowRankKernel``, neuraloperator's centred
``SpectralConv``), the suffix names it: ``"ipot_inducing_point_operator:model"``. The plain slug
raises ``ValueError`` naming the suffixed spelling, so the params you get are never silently those
of another function. ``supported_slugs()`` lists these names; :func:`refattn.interop.coverage.torch_coverage` counts such a slug as mapped. A frozen upstream parameter
(``requires_grad=False``: TransNormer's URPE reflection ``urpe.v``, a bias-free ``MyConv1D``'s zero
bias) is mapped like the others but its gradient, which torch does not compute, is not compared.

``check_module`` runs your ``nn.Module`` and refattn side by side (the module's own weights,
mapped by the table) on a battery of inputs sized for the module, and compares the output and the
gradient of every input and every parameter with
:func:`refattn.testing.compare_implementation`'s rules; it returns a
:class:`refattn.testing.CompareReport`.

torch is imported inside the functions that need it (``check_module``); ``params_from_state_dict``
and ``grads_to_state_dict`` accept torch tensors or NumPy arrays and do not import torch at all.

The per-slug table (the rules above, each slug's input builder and call convention) is in
:mod:`refattn.interop.torch_specs`.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .. import registry
from ..registry import Sample
from ..testing.compare import CompareReport, compare_implementation
from .torch_specs import MODULE_CASES, SPECS, Spec, View, load_rules
from .unmapped import UNMAPPED


def _load_spec_groups() -> None:
    """Import every sibling ``torch_specs_<group>`` module: each registers its rows into ``SPECS``
    (and its unmappable slugs into ``UNMAPPED``) on import. A new group is a new file, nothing else."""
    import importlib
    import pkgutil

    from . import __path__ as here

    for info in sorted(pkgutil.iter_modules(here), key=lambda i: i.name):
        if info.name.startswith("torch_specs_"):
            importlib.import_module(f"{__package__}.{info.name}")


_load_spec_groups()

__all__ = ["params_from_state_dict", "grads_to_state_dict", "check_module", "supported_slugs",
           "MODULE_CASES"]


# --------------------------------------------------------------------------------------------
# Public API


def supported_slugs() -> dict[str, str]:
    """``{slug: upstream module}`` for every mechanism ``params_from_state_dict`` maps; a full layer
    is listed as ``"slug:layer"`` (see the module docstring)."""
    return {key: spec.upstream for key, spec in SPECS.items()}


def _record(spec: Spec) -> registry.Mechanism:
    """The registry record, or for a ``slug:layer`` spec the same record running the layer pair."""
    rec = registry.get(spec.slug)
    if spec.layer is None:
        return rec
    return dataclasses.replace(rec, slug=spec.key, forward=spec.layer[0], backward=spec.layer[1], cases={})


def _get_spec(slug) -> Spec:
    if not isinstance(slug, str):
        raise TypeError(f"slug must be a registry slug (str); got {type(slug).__name__}")
    if slug in SPECS:
        return SPECS[slug]
    variants = [k for k in SPECS if k.startswith(f"{slug}:")]
    if variants:
        lay = SPECS[variants[0]]
        raise ValueError(f"refattn.interop.torch maps {slug!r} as {lay.layer[0].__name__} "
                         f"({lay.upstream}), not as the record's core {registry.get(slug).forward.__name__}: "
                         f"pass the slug {' or '.join(map(repr, variants))}")
    if ":" in slug:
        raise ValueError(f"refattn.interop.torch has no mapping {slug!r}; the suffixed names are "
                         f"{', '.join(k for k in SPECS if ':' in k)}")
    try:
        rec = registry.get(slug)
    except registry.UnknownMechanism as exc:
        raise ValueError(f"refattn.interop.torch: {exc}") from None
    if slug in UNMAPPED:
        status, reason = UNMAPPED[slug]
        raise ValueError(f"refattn.interop.torch has no state_dict table for {slug!r} ({status}): {reason}. "
                         f"Compare it with refattn.testing.compare_implementation.")
    code = (rec.official_code or "").strip()
    why = ("the catalogue names no official PyTorch code for it" if not code or code.startswith(("—", "-"))
           else f"its official code ({code}) has no state_dict table here yet")
    raise ValueError(f"refattn.interop.torch has no state_dict mapping for {rec.slug!r}: {why} "
                     f"(refattn.interop.coverage.torch_coverage() lists every mechanism). Mapped slugs: "
                     f"{', '.join(SPECS)}. Build its params by hand (weights (in, out) = torch weight.T) "
                     f"and check them with refattn.testing.compare_implementation.")


def _weightless(slug) -> bool:
    return isinstance(slug, str) and UNMAPPED.get(slug, ("",))[0] == "no weights"


def _check_config(spec: Spec, config: dict) -> None:
    rec = _record(spec)
    sig = inspect.signature(rec.forward)
    allowed = {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY} | set(spec.build_keys)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return  # e.g. IPOT's whole model passes its core's keywords on: the core checks them
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise TypeError(f"{spec.key}: unknown config keywords {unknown}; {rec.forward.__name__} takes "
                        f"{sorted(allowed)}")




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
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors; got {type(state_dict).__name__}")
    if _weightless(slug):
        keys = sorted(k for k in state_dict if k.startswith(prefix))
        if keys:
            raise ValueError(f"params_from_state_dict[{slug}]: the mechanism has no weights "
                             f"({UNMAPPED[slug][1]}), but the state_dict has {prefix!r}-keys {keys[:8]}: "
                             f"they belong to layers around it (project q, k, v yourself)")
        return {}
    spec = _get_spec(slug)
    _check_config(spec, config)
    view = View(state_dict, prefix, spec.key)
    if not view.items and not (spec.rules == [] and not spec.required):  # an empty table: no weights
        raise ValueError(f"params_from_state_dict[{spec.key}]: no key starts with prefix {prefix!r}; "
                         f"first keys: {sorted(state_dict)[:8]}")
    for name in spec.required:
        view.require(name)  # a missing required key is named here, before anything else
    out: dict = {}
    for rule in load_rules(spec, view.items, config):
        rule.load(view, out)
    left = sorted(set(view.items) - view.used)
    if strict and left:
        why = [f"{prefix + k} ({spec.unsupported[k]})" for k in left if k in spec.unsupported]
        raise ValueError(f"params_from_state_dict[{spec.key}]: keys with no counterpart in refattn: "
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
    if not isinstance(grads, Mapping):
        raise TypeError(f"grads must be a dict of gradients; got {type(grads).__name__}")
    if _weightless(slug):
        return {}
    spec = _get_spec(slug)
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
        A ``torch.nn.Module`` computing mechanism ``slug`` with upstream parameter names (for a
        per-layer mechanism of a layer stack, e.g. CRATE, a stack of depth 1: the table reads
        its first layer).
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
    rec = _record(spec)
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
    for kw, val in spec.defaults.items():
        cfg.setdefault(kw, val)
    if spec.infer is not None:
        for kw, val in spec.infer(m.state_dict().keys()).items():
            cfg.setdefault(kw, val)
    sig = inspect.signature(rec.forward).parameters
    needed = [n for n, q in sig.items() if q.kind is q.KEYWORD_ONLY and q.default is q.empty and n not in cfg
              and n not in spec.kw_inputs]
    if needed:
        hint = {kw: attr for kw, attr in spec.attrs.items() if kw in needed}
        raise ValueError(f"check_module[{spec.key}]: config must give {needed}"
                         + (f" (read from the module's attributes {hint} when it has them)" if hint else ""))
    base_cfg = {k: v for k, v in cfg.items() if k != "rel_pos" and k not in spec.build_keys}
    params = params_from_state_dict(spec.key, m.state_dict(), prefix=spec.module_prefix, **base_cfg)
    params = {k: v.astype(np.float64) for k, v in params.items()}
    if "params" not in sig:  # a weightless core (performer, codomain attention ...)
        params = None
    names_avail = dict(MODULE_CASES)
    if spec.key == "multi_head_attention":
        names_avail["cross"] = dict(b=2, n=4, m=9, cross=True)
    names = list(names_avail) if cases is None else [cases] if isinstance(cases, str) else list(cases)
    unknown = [c for c in names if c not in names_avail]
    if unknown:
        raise ValueError(f"check_module: unknown cases {unknown}; the cases are {list(names_avail)}")
    call = call or spec.call

    report = CompareReport(spec.key, vjp_given=True)
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
    ref_names = list(rec.backward(np.ones_like(out), cache))
    diff_inputs = [k for k in inputs if k in ref_names]
    named_params = {n: p for n, p in m.named_parameters() if p.requires_grad}
    # a frozen parameter (requires_grad=False, e.g. URPE's reflection vector) has no torch gradient:
    # its refattn names (found by mapping NaN in its place) are left out of the comparison
    probe = {n: (torch.full_like(p, float("nan")) if n not in named_params and p.is_floating_point() else p)
             for n, p in m.state_dict().items()}
    frozen = {k for k, v in params_from_state_dict(spec.key, probe, prefix=spec.module_prefix, strict=False,
                                                   **run_cfg).items() if np.isnan(v).any()}

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
        sd.update({n: torch.zeros_like(t) for n, t in m.state_dict().items() if n not in sd})  # frozen params
        res.update({k: v for k, v in params_from_state_dict(spec.key, sd, prefix=spec.module_prefix, strict=False,
                                                            **run_cfg).items() if k not in frozen})
        return res

    return compare_implementation(fn, rec, vjp=vjp, sample=smp, seed=seed, dtype=np_dt,
                                  convert=lambda a: _to_torch(torch, a, tdt), rtol=rtol, atol=atol,
                                  grads=[k for k in ref_names if k not in frozen] if frozen else None)
