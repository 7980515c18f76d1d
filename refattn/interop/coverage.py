"""Which catalogue mechanisms ``refattn.interop.torch`` maps, and why the others are not.

``torch_coverage()`` sorts every implemented catalogue mechanism into one of the groups of :data:`STATUSES`, from
data refattn already holds (no torch import):

``"mapped"``
    :func:`refattn.interop.torch.params_from_state_dict` takes the upstream ``state_dict``; the
    detail names the upstream module the table follows. A mechanism whose upstream module is the
    full layer refattn implements beside the record's core is mapped as ``"slug:layer"`` (the
    detail starts with that name).
``"no weights"``, ``"no PyTorch module"``, ``"code not readable"``, ``"reconstruction"``
    official code exists but there is no ``state_dict`` to map: the mechanism has no trainable
    parameters, or its code is JAX/TensorFlow/Theano/Lua/MindSpore, or it could not be read here,
    or refattn builds the sub-networks the upstream takes from other libraries
    (:data:`refattn.interop.unmapped.UNMAPPED` holds each one's reason, which the detail quotes).
``"no official code"``
    neither the record nor the catalogue names code for it (the record's ``official_code``, which
    defaults to the catalogue's "Official code" column, is empty or starts with "—"; the detail
    quotes it: a JAX listing, proprietary code ...). Build its params by hand and check them with
    :func:`refattn.testing.compare_implementation`.
``"not mapped yet"``
    code exists — the authors' or, where they published none, the port refattn follows (the detail
    quotes the record's ``official_code``) — but its ``state_dict`` table is not written. refattn's params still use the upstream parameter names (``Linear`` weights
    transposed to ``(in, out)``, conv kernels in PyTorch's layout), so a hand port is mechanical.

The docs page "Port an official module" renders this as a table at build time.
"""

from __future__ import annotations

from .. import registry
from .torch import supported_slugs
from .unmapped import UNMAPPED, UNMAPPED_STATUSES

__all__ = ["torch_coverage", "STATUSES"]

STATUSES = ("mapped", *UNMAPPED_STATUSES, "not mapped yet", "no official code")


def torch_coverage() -> dict[str, tuple[str, str]]:
    """``{slug: (status, detail)}`` for every implemented catalogue mechanism (primitives such as
    ``softmax`` or ``linear`` are not catalogue entries and are left out); ``status`` is one of
    :data:`STATUSES`."""
    mapped = supported_slugs()
    catalogue = registry.catalog_rows()
    out = {}
    for rec in registry.all(implemented=True):
        if rec.slug not in catalogue:
            continue
        code = (rec.official_code or "").strip()
        keys = [k for k in mapped if k == rec.slug or k.startswith(f"{rec.slug}:")]  # the forward, a layer ...
        if keys:
            out[rec.slug] = ("mapped", "; ".join(f"{key}: {mapped[key]}" if key != rec.slug else mapped[key]
                                                for key in keys))
        elif rec.slug in UNMAPPED:
            out[rec.slug] = UNMAPPED[rec.slug]
        elif not code or code.startswith(("—", "-")):
            out[rec.slug] = ("no official code", code.lstrip("—- ").strip("() ") or "the catalogue names none")
        else:
            out[rec.slug] = ("not mapped yet", code)
    return out
