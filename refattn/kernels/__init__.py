"""Jitted kernels: ``kernels.cpu`` (Numba) and ``kernels.cuda`` (numba.cuda), mirroring the reference."""
