"""Assertions shared by the ``tests/test_interop_*.py`` files (one per ``torch_specs_<group>`` module)."""

from __future__ import annotations

import numpy as np

from refattn.interop.torch import grads_to_state_dict, params_from_state_dict, supported_slugs


def assert_pass(report):
    """A ``check_module`` report that passed (its table printed otherwise)."""
    assert report.passed, "\n" + str(report)
    return report


def assert_registered(group_slugs, modules):
    """A group's keys are in the table, and its round-trip test covers every one of them."""
    assert set(group_slugs) <= set(supported_slugs())
    assert sorted(group_slugs) == sorted(modules)


def assert_round_trip(slug, module, cfg=None, derived=(), *, derived_unread=True):
    """``params_from_state_dict`` then ``grads_to_state_dict`` (the same table read backwards, under a
    prefix) gives back exactly the module's state_dict, minus the ``derived`` buffers the table
    reads and drops (which then never appear among the params unless ``derived_unread=False``: a
    tied weight read once under another name)."""
    cfg = cfg or {}
    sd = module.state_dict()
    p = params_from_state_dict(slug, sd, **cfg)
    if derived_unread:
        assert not set(derived) & set(p)
    back = grads_to_state_dict(slug, p, prefix="attn.", **cfg)
    assert sorted(back) == sorted("attn." + k for k in sd if k not in derived)
    for k, v in sd.items():
        if k not in derived:
            np.testing.assert_array_equal(back["attn." + k], v.numpy())
