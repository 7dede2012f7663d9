"""The compiled kernels, as implementation files: `linattn.kernels.cpu_numba` (the fused CPU token loop:
prefill, its backward, the general step), `linattn.kernels.cpu_decode` (the batch-1 decode step) and
`linattn.kernels.triton` (Triton chunk kernels, their backward and the Triton step).

Which one runs a call, and why a forced one cannot, is decided in `linattn.backends`; nothing here is
imported by ``import linattn`` (numba and Triton load on first use).
"""

from __future__ import annotations

from linattn.checks import BACKENDS, check_backend

__all__ = ["BACKENDS", "check_backend"]
