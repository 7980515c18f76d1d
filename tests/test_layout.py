"""The layout rules of docs/architecture.md, checked over the source tree.

* No module under ``refattn/`` outside ``kernels/`` is longer than 900 lines, and one longer than
  800 says why in its docstring.
* No module imports a leading-underscore name from another module (a private *module* may be
  imported whole: ``from . import _attention as _k``).
* A module that registers records keeps them below the registry separator, with the math above.
* Every family package exports the public functions of its modules; a function named like its own
  module (``sdpa`` in ``sdpa.py``) is exported too, and no other name hides a module.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import refattn

ROOT = Path(refattn.__file__).resolve().parent
SEPARATOR = (
    "# =============================================================================================\n"
    "# Registry record: sampler, explicit reference and identity checks (verification, not the math)\n"
    "# =============================================================================================\n"
)
MECHANISM_PACKAGES = ("nn", "attention", "operators", "blocks")
FAMILY_PACKAGES = ("refattn.nn", "refattn.attention.softmax", "refattn.attention.differential",
                   "refattn.attention.linear", "refattn.operators", "refattn.blocks")


def _modules():
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT.parent))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_module_length():
    too_long, unexplained = [], []
    for p in _modules():
        if "kernels" in p.relative_to(ROOT).parts:
            continue
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > 900:
            too_long.append(f"{_rel(p)} ({n} lines)")
        elif n > 800:
            doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
            if "800 lines" not in doc:
                unexplained.append(f"{_rel(p)} ({n} lines; its docstring must say why it needs more than 800 lines)")
    assert not too_long, "modules over 900 lines: " + ", ".join(too_long)
    assert not unexplained, "\n".join(unexplained)


def test_no_private_names_imported_across_modules():
    bad = []
    for p in _modules():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            for alias in node.names:
                # `from . import _attention` imports a private module whole: allowed.
                if not module and _is_private(alias.name):
                    continue
                if _is_private(alias.name):
                    bad.append(f"{_rel(p)}:{node.lineno}: from {'.' * node.level}{module} import {alias.name}")
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def _registering_modules():
    for p in _modules():
        rel = p.relative_to(ROOT).parts
        if rel[0] not in MECHANISM_PACKAGES:
            continue
        text = p.read_text(encoding="utf-8")
        if "register(" in text and "Mechanism(" in text:
            yield p, text


def test_records_sit_below_the_separator():
    bad = []
    for p, text in _registering_modules():
        if text.count(SEPARATOR) != 1:
            bad.append(f"{_rel(p)}: needs exactly one registry separator (found {text.count(SEPARATOR)})")
            continue
        cut = text.index(SEPARATOR)
        head = ast.parse(text[:cut])
        for node in head.body:
            name = getattr(node, "name", "")
            # A registry check has the signature ``_check_xxx(rng)``; a validator such as
            # ``_check_params(params, ...)`` is part of the math and may stay above.
            is_check = name.startswith("_check_") and [a.arg for a in node.args.args] == ["rng"] \
                if isinstance(node, ast.FunctionDef) else False
            if isinstance(node, ast.FunctionDef) and (name.startswith(("_sample", "_reference")) or is_check):
                bad.append(f"{_rel(p)}:{node.lineno}: {name} is verification code above the separator")
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                    and getattr(node.value.func, "id", "") == "register":
                bad.append(f"{_rel(p)}:{node.lineno}: register(...) above the separator")
        tail_defs = [n.name for n in ast.parse(text[cut:]).body if isinstance(n, ast.FunctionDef)]
        public_tail = [n for n in tail_defs if not n.startswith("_")]
        if public_tail:
            bad.append(f"{_rel(p)}: public functions below the separator (the math goes above it): {public_tail}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", FAMILY_PACKAGES)
def test_family_package_exports_its_public_functions(package):
    try:
        pkg = importlib.import_module(package)
    except ImportError:
        pytest.skip(f"{package} does not exist")
    missing = []
    for info in pkgutil.iter_modules(pkg.__path__, prefix=package + "."):
        if _is_private(info.name.rsplit(".", 1)[-1]) or info.ispkg:
            continue
        mod = importlib.import_module(info.name)
        submodules = {i.name.rsplit(".", 1)[-1] for i in pkgutil.iter_modules(pkg.__path__)}
        for name in getattr(mod, "__all__", []):
            # ``from package import mha`` must give the function ``mha`` of ``mha.py`` (what a user
            # expects), never a module; a name equal to another module's is not exported at all.
            if name in submodules and name != info.name.rsplit(".", 1)[-1]:
                assert getattr(pkg, name) is importlib.import_module(f"{package}.{name}"), \
                    f"{package}.{name} hides the module {package}.{name}"
                continue
            if getattr(pkg, name, None) is not getattr(mod, name):
                missing.append(f"{info.name}.{name}")
    assert not missing, f"{package} does not export: {', '.join(missing)}"


def test_top_level_names_users_reach_first():
    import numpy as np

    from refattn.attention.softmax.sdpa import sdpa_forward

    assert refattn.get("sdpa").forward is sdpa_forward
    assert refattn.sdpa_forward is sdpa_forward
    assert {r.slug for r in refattn.mechanisms(family="2-differential")} >= {"diff_attention_v1", "diffclip_attention"}
    q = np.random.default_rng(0).standard_normal((1, 2, 3, 4))
    np.testing.assert_array_equal(refattn.sdpa(q, q, q), sdpa_forward(q, q, q)[0])
    for name in refattn.__all__:
        assert hasattr(refattn, name), name
