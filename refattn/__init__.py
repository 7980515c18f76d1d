"""refattn — reference implementations of attention mechanisms and neural-operator layers.

Every mechanism is a pair of pure NumPy functions, ``xxx_forward(...) -> (out, cache)`` and
``xxx_backward(dout, cache) -> {name: grad}``, with a hand-derived backward verified against
finite differences. The catalogue of mechanisms lives in :mod:`refattn.registry`; verification
tools in :mod:`refattn.testing`; jitted kernels in :mod:`refattn.kernels`.
"""

from . import registry, testing

__version__ = "0.1.0"
__all__ = ["registry", "testing", "__version__"]
