"""The Triton backend (``backend="triton"``): whether the Triton kernels in `linattn.kernels.triton` can take a
call, and why not (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``). Whether it runs is
`linattn.backends`' decision (opt-in until a GPU run has measured the kernels)."""

from __future__ import annotations

import importlib

import torch


def refusal(rule: str, tensors: tuple, state: torch.Tensor, grad: bool | None, extra: dict | None,
            chunk_size: int | None = None):
    """(Triton module, None) when the Triton kernels can take this call, else (None, why). ``grad`` None: autograd
    is fine (the chunk kernels have a backward); True: refused (the decode step has none). ``chunk_size``: the
    whole-sequence call's (None for a decode step)."""
    q, _, v, g, _ = tensors
    unknown = [name for name, x in (extra or {}).items() if x is not None]
    if unknown:
        return None, f"it does not take {', '.join(unknown)}"
    if v.shape[-2] != q.shape[-2]:
        return None, "it needs as many value heads as query heads"
    if g is not None and rule in ("delta", "gated_delta") and g.dim() == q.dim():
        return None, "its delta rules take one gate per head"
    if grad:
        return None, "its decode step has no backward (inputs require grad)"
    try:
        kt = importlib.import_module("linattn.kernels.triton")
    except Exception as exc:  # triton missing or failing to load
        return None, f"triton is unavailable ({type(exc).__name__}: {exc})"
    why = kt.refusal(q, state, state.shape[-2], chunk_size)
    return (kt, None) if why is None else (None, why)
