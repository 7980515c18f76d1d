"""Shared primitives with forward and hand-derived backward: softmax, norms, activations, linear, RoPE,
and the spatial ones — convolution (``conv``), pooling, grid sampling (``sampling``) and Swin windows /
unfold / fold (``windows``).

Every attention and operator module builds on these instead of re-deriving them inline.
"""
