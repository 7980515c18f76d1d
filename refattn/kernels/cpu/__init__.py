"""Numba CPU kernels mirroring the NumPy references (design: ``docs/kernels.md``).

* :mod:`.flash` — fused flash-style softmax attention (SDPA): forward with LSE, FlashAttention-2
  backward (reached from :func:`refattn.attention.softmax.sdpa_forward` with ``backend="numba"``);
* :mod:`.differential` — fused differential attention (DIFF Transformer V1 core) with the λ gradient;
* :mod:`.linear` — causal linear attention, prefix-state scan forward and reverse-scan backward.

Each module validates its arguments in Python before a kernel runs and attaches its kernel and a
parity check to the registry record (``add_kernel(slug, "numba_cpu", fn, check)``).
"""
