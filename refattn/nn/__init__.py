"""Shared primitives with forward and hand-derived backward: softmax, norms, activations, linear, RoPE.

Every attention and operator module builds on these instead of re-deriving them inline.
"""
