"""The compiled kernels, as implementation files, one kernel each: on the CPU `linattn.kernels.cpu_prefill` (the
fused token loop over whole sequences), `linattn.kernels.cpu_backward` (its backward), `linattn.kernels.cpu_loop`
(the general step), `linattn.kernels.cpu_decode` (the one-call decode step), `linattn.kernels.cpu_ssm` (Mamba-2's
decode step as HF calls it) and `linattn.kernels.cpu_conv` (the short convolution), with
`linattn.kernels.cpu_intrinsics` (what they share, inlined) and `linattn.kernels.cpu_threads` (how they run on
threads); `linattn.kernels.triton` (Triton chunk kernels, their backward and the Triton step).

Which one runs a call, and why a forced one cannot, is decided in `linattn.backends`; nothing here is
imported by ``import linattn`` (numba and Triton load on first use).
"""

from __future__ import annotations

from linattn.checks import BACKENDS, check_backend

__all__ = ["BACKENDS", "check_backend"]
