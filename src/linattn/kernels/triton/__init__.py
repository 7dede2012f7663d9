"""Triton kernels for CUDA behind the kernel contract of `linattn.ops` (see its docstring).

* ``chunk_kernel(rule)``: the chunk forward in one Triton kernel per rule (accumulate and gated per head or per
  key channel in ``_chunk.py``, delta and gated delta in the WY/UT form in ``_delta.py``), state carried in
  float32 (float64 for float64 inputs), any T, Dk != Dv, half-precision operands with float32 accumulation.
* ``step_kernel(rule)``: the fused one-token decode (``_step.py``): decay, write and read in one kernel, in place.
* ``linear_attention(...)`` / ``step(...)``: whole calls for the backend dispatch in `linattn.kernels` (inputs
  as `linattn.linear_attention` validated them; feature map, normalizer column and epsilon handled here).

Gradients: for accumulate and gated (per head or per key channel) the backward is three more runs of the Triton
chunk forward kernel (``_backward.py``: dq as a forward pass, dk and dv as forward passes in reversed time, dg
from them). For the delta rules it is two Triton kernels (``_delta_backward.py``): the chunks in reversed order for
the state's gradient and the gradient of the true writes U', then every chunk at once for dq, dk, dv, dbeta and
dg through the WY/UT algebra, from what the forward kept ((I + A)^{-1}, W, the chunk states, U'). Only
accumulate and gated with a value width over 256 still recompute with the torch chunk form and differentiate it.
A decode step that needs gradients (not in place, an input requiring grad) runs the torch step itself.

Running on CPU tensors: only under Triton's interpreter, i.e. with ``TRITON_INTERPRET=1`` in the environment when
these kernels are first loaded (Triton decides at decoration time). ``unavailable_reason`` says why the kernels
cannot take given tensors; importing this package does not import triton.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch

from linattn.layout import with_ones_column, zero_state
from linattn.ops import DELTA_RULES
from linattn.ops.common import normalized_read

__all__ = [
    "chunk_kernel", "step_kernel", "unavailable_reason", "interpreted", "linear_attention", "step", "SUPPORTED_DTYPES",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MODULES = ("_common", "_chunk", "_delta", "_step", "_backward", "_delta_backward")


_LOADED: dict[str, ModuleType] = {}


def _load() -> dict[str, ModuleType]:
    """The kernel modules, imported (and their kernels decorated) on first use; cached: decode calls this per step."""
    if not _LOADED:
        _LOADED.update({name: importlib.import_module(f"{__name__}.{name}") for name in _MODULES})
    return _LOADED


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (loaded with TRITON_INTERPRET=1): then on CPU tensors."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_load()["_step"]._step_kernel, InterpretedFunction)


def unavailable_reason(device: torch.device, dtype: torch.dtype, key_dim: int) -> str | None:
    """Why the Triton kernels cannot run on tensors of this device, dtype and feature width; None if they can."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton, on a CUDA machine)"
    if dtype not in SUPPORTED_DTYPES:
        return f"the Triton kernels take float16/bfloat16/float32/float64 tensors, got {dtype}"
    from linattn.kernels.triton._common import MAX_DK

    if key_dim > MAX_DK:
        return f"the Triton kernels hold the whole key width in one block: feature width {key_dim} > {MAX_DK}"
    if device.type == "cuda":
        return None
    if interpreted():
        return None
    hint = "" if os.environ.get("TRITON_INTERPRET") == "1" else ", or TRITON_INTERPRET=1 before they are first loaded"
    return f"the Triton kernels need CUDA tensors, got {device}{hint}"


def _torch_rule(rule: str) -> ModuleType:
    return importlib.import_module(f"linattn.ops.{rule}")


class _TritonChunk(torch.autograd.Function):
    """Forward: the Triton chunk kernel. Backward: Triton (``_backward`` for accumulate and gated, ``_delta_backward``
    for the delta rules); accumulate and gated with Dv > 256 recompute with the torch chunk form instead."""

    @staticmethod
    def forward(ctx, rule, chunk_size, scale, tracked, q, k, v, g, beta, s0):
        ctx.rule, ctx.chunk_size, ctx.scale = rule, chunk_size, scale
        kernels = _load()
        if rule in DELTA_RULES:
            # Recording a graph, the forward also keeps (I + A)^{-1}, W, the chunk states and U' for the backward
            # (``tracked``: decided by the caller, grad mode being off inside forward).
            save = tracked
            out = kernels["_delta"].chunk_delta(q, k, v, g=g, beta=beta, initial_state=s0, chunk_size=chunk_size,
                                                scale=scale, save=save)
            o, S = out[:2]
            ctx.delta_saved = out[2] if save else None
        else:
            o, S = kernels["_chunk"].chunk_linear(q, k, v, g=g, initial_state=s0, chunk_size=chunk_size, scale=scale)
        ctx.save_for_backward(q, k, v, g, beta, s0, S)
        return o, S

    @staticmethod
    def backward(ctx, grad_o, grad_S):
        *saved, S_final = ctx.saved_tensors
        need = ctx.needs_input_grad[4:]
        q, g = saved[0], saved[3]
        # The Triton backward runs the forward kernel with the values as keys: the value width must fit a block.
        v_fits = saved[2].shape[-1] <= _load()["_common"].MAX_DK
        if ctx.rule in ("accumulate", "gated") and v_fits:
            grads = _load()["_backward"].chunk_linear_backward(
                *saved[:4], saved[5], S_final, grad_o, grad_S, chunk_size=ctx.chunk_size, scale=ctx.scale
            )
            return (None, None, None, None, *(gr if n else None for gr, n in zip(grads, need, strict=True)))
        if ctx.rule in DELTA_RULES:
            grads = _load()["_delta_backward"].chunk_delta_backward(
                *saved, ctx.delta_saved, grad_o, grad_S, scale=ctx.scale
            )  # (ctx keeps the buffers until the graph is freed: a retain_graph backward can run again)
            return (None, None, None, None, *(gr if n else None for gr, n in zip(grads, need, strict=True)))
        with torch.enable_grad():
            leaves = [None if x is None else x.detach().requires_grad_(n) for x, n in zip(saved, need, strict=True)]
            q, k, v, g, beta, s0 = leaves
            if s0 is None:
                s0 = zero_state(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], False, q.dtype, q.device)
            o, S = _torch_rule(ctx.rule).FORMS["chunk"](
                q, k, v, g=g, beta=beta, initial_state=s0, chunk_size=ctx.chunk_size, scale=ctx.scale
            )
            outs = [(o, grad_o), (S, grad_S)]
            outs = [(x, gx.to(x.dtype)) for x, gx in outs if gx is not None]
            wrt = [x for x in leaves if x is not None and x.requires_grad]
            got = iter(torch.autograd.grad([x for x, _ in outs], wrt, [gx for _, gx in outs], allow_unused=True))
        grads = [next(got) if x is not None and x.requires_grad else None for x in leaves]
        return (None, None, None, None, *grads)


def chunk_kernel(rule: str):
    """The Triton chunk forward of ``rule`` with the ``linattn.ops`` kernel contract (gradients as described above)."""

    def chunk(q, k, v, *, g=None, beta=None, initial_state=None, chunk_size=64, scale=1.0):
        inputs = (q, k, v, g, beta, initial_state)
        tracked = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)
        return _TritonChunk.apply(rule, chunk_size, scale, tracked, *inputs)

    chunk.__doc__ = f"Triton chunk forward of rule {rule!r} (linattn.ops kernel contract)."
    return chunk


def step_kernel(rule: str):
    """The fused Triton decode step of ``rule`` with the ``linattn.ops`` step contract.

    With autograd in play (not in place, and an input requiring grad) it runs the torch step instead: the
    Triton kernel writes the state in place and records no graph.
    """
    delta = rule in DELTA_RULES

    def step(q, k, v, *, g=None, beta=None, state, inplace=False):
        tracked = (q, k, v, g, beta, state)
        if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tracked):
            if inplace:
                raise ValueError("inplace=True: the in-place decode step records no gradient; pass inplace=False")
            return _torch_rule(rule).step(q, k, v, g=g, beta=beta, state=state, inplace=False)
        return _load()["_step"].step(q, k, v, g=g, beta=beta, state=state, inplace=inplace, delta=delta)

    step.__doc__ = f"Triton decode step of rule {rule!r} (linattn.ops step contract)."
    return step


# ------------------------------------------------------------------------------------------- dispatch entry points
def refusal(q: torch.Tensor, state: torch.Tensor, key_dim: int, chunk_size: int | None = None) -> str | None:
    """Why this backend cannot take a call with these inputs, this (augmented) state and ``chunk_size`` (None: a
    decode step); None if it can."""
    reason = unavailable_reason(q.device, q.dtype, key_dim)
    if reason is not None:
        return reason
    if chunk_size is not None:
        from linattn.kernels.triton._common import check_chunk_size

        reason = check_chunk_size(chunk_size)
        if reason is not None:
            return reason
    want = torch.float64 if q.dtype == torch.float64 else torch.float32
    if state.dtype != want:
        return f"it carries the state in {want} for {q.dtype} inputs, got state dtype {state.dtype}"
    return None


def linear_attention(
    *, rule: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
    beta: torch.Tensor | None, state: torch.Tensor, fmap, scale: float | None, normalize: bool, eps: float,
    eps_mode: str, chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole sequence through the Triton chunk kernel of ``rule`` (any form asked for: they are one function).

    Inputs in the public layout ``[B, T, H, D]`` as validated by `linattn.linear_attention`, before the
    feature map; ``state`` the starting ``[B, H, Dk, Dv(+1)]`` state (normalizer as the last column), not modified.
    Without a feature map q and k enter the kernel in their own dtype (bfloat16 products on the tensor cores,
    accumulated in float32); with one, the features are computed and kept in the state's dtype, as the torch path
    does. Returns ``o [B, T, H, Dv]`` (contiguous, ``v.dtype``) and the final state in the augmented layout.
    Gradients flow (see the module docstring).
    """
    acc = state.dtype
    if fmap is not None:
        q, k = fmap(q.to(acc)), fmap(k.to(acc))
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    vv = with_ones_column(v, q.dtype) if normalize else v.to(q.dtype)

    def hf(x):
        return None if x is None else x.transpose(1, 2)

    o, S = chunk_kernel(rule)(hf(q), hf(k), hf(vv), g=hf(g), beta=hf(beta), initial_state=state,
                              chunk_size=chunk_size, scale=scale)
    o = o.transpose(1, 2)
    if normalize:
        o = normalized_read(o.to(acc), eps, eps_mode)
    return o.to(v.dtype).contiguous(), S


def step(
    *, rule: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
    beta: torch.Tensor | None, state: torch.Tensor, normalize: bool, eps: float, eps_mode: str, inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token through the fused Triton step: ``q`` (already scaled), ``k`` features ``[B, H, Dk]``,
    ``v [B, H, Dv]``; ``state [B, H, Dk, Dv(+1)]`` (any strides, unit along the last), updated in place when
    ``inplace``. Returns (o ``[B, H, Dv]`` in ``v.dtype``, state)."""
    # One launch: the kernel writes z's value 1 itself, divides by q^T z and writes o in v's dtype.
    return _load()["_step"].step(q, k, v, g=g, beta=beta, state=state, inplace=inplace, delta=rule in DELTA_RULES,
                                 normalize=normalize, eps=eps, eps_mode=eps_mode, out_dtype=v.dtype)
