"""Numba kernels. Loops only: every attribute arrives here already validated and resolved."""
