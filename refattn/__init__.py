"""refattn — reference implementations of attention mechanisms and neural-operator layers.

Every mechanism is a pair of pure NumPy functions, ``xxx_forward(...) -> (out, cache)`` and
``xxx_backward(dout, cache) -> {name: grad}``, with a hand-derived backward verified against
finite differences. The names reached first are here:

* the registry: ``refattn.get(slug)`` (one record per catalogue slug: forward, backward, sampler,
  checks, docs), ``refattn.mechanisms(...)`` (all records, filterable by family or status);
* the attention everyone starts from: ``refattn.sdpa`` / ``sdpa_forward`` / ``sdpa_backward``,
  ``mha_forward`` / ``mha_backward``, the differential core and DIFF V1 layer;
* the verification tools: ``gradcheck``, ``directional_check``, ``compare_implementation``.

Everything else is one import away, by family: `refattn.attention.softmax`,
`refattn.attention.differential`, `refattn.attention.linear`, `refattn.operators`,
`refattn.blocks`, the primitives in `refattn.nn`, the kernels in `refattn.kernels`, and PyTorch
weights and modules through `refattn.interop.torch` (torch imported only there, lazily).
"""

from . import registry, testing
from .attention.differential import (
    diff_attention_core_backward,
    diff_attention_core_forward,
    diff_attention_v1_backward,
    diff_attention_v1_forward,
)
from .attention.softmax import mha_backward, mha_forward, sdpa_backward, sdpa_forward
from .attention.softmax.sdpa import sdpa
from .registry import Mechanism, Sample, get
from .registry import all as mechanisms
from .testing import compare_implementation, directional_check, gradcheck

__version__ = "0.1.0"
__all__ = [
    "registry", "testing", "__version__", "Mechanism", "Sample", "get", "mechanisms",
    "sdpa", "sdpa_forward", "sdpa_backward", "mha_forward", "mha_backward",
    "diff_attention_core_forward", "diff_attention_core_backward",
    "diff_attention_v1_forward", "diff_attention_v1_backward",
    "gradcheck", "directional_check", "compare_implementation",
]
