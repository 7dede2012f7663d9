"""The short causal convolution (depthwise, with SiLU) that fla's and Qwen3-Next's linear layers put before q, k
and v: a torch form (any dtype and device, any order of derivative) and, for float32 CPU tensors, one compiled
pass each way (:mod:`linattn.kernels.cpu_conv`); a double backward recomputes in the torch form."""

from __future__ import annotations

import importlib
import warnings

import torch
import torch.nn.functional as F

from linattn.backends import functorch_active

_kernel = None
_failed = False


def sequence_offsets(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """Position of every packed token inside its own sequence, ``[T]``."""
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
    return torch.arange(T, device=cu.device) - cu[:-1][rows]


def causal_conv(x, weight, history=None, cu_seqlens=None):
    """Depthwise causal convolution with SiLU: ``y_t = silu(sum_j w[:, j] x_{t-K+1+j})``, x ``[B, T, C]``,
    weight ``[C, K]``. ``history [B, K-1, C]`` is the input before x (zeros if None); with ``cu_seqlens`` no tap
    reaches into the previous sequence. Returns (y, the new history: the last K-1 inputs)."""
    B, T, C = x.shape
    K = weight.shape[-1]
    if history is None:
        history = x.new_zeros(B, K - 1, C)
    xs = torch.cat([history.to(x.dtype), x], dim=1)  # [B, K-1+T, C]
    tail = xs[:, T:] if K > 1 else xs[:, :0]
    offs = None if cu_seqlens is None else sequence_offsets(cu_seqlens, T)
    # The compiled pass reads raw memory, which torch.func wrappers lack: under a transform the torch form runs.
    plain = x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and not functorch_active()
    kernel = _load() if plain else None
    if kernel is not None:
        return _CompiledConv.apply(xs, weight, offs, kernel), tail
    return conv_torch(xs, weight, offs), tail


def conv_torch(xs: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    """The torch form on the history-prefixed input ``xs [B, K-1+T, C]``: K shifted multiply-adds, then SiLU."""
    K = weight.shape[-1]
    T = xs.shape[1] - K + 1
    y = xs[:, K - 1:] * weight[:, K - 1]
    for j in range(K - 1):
        lag = K - 1 - j  # tap j reads token t - lag
        tap = xs[:, j:j + T]
        if offs is not None:  # no tap reaches into the previous sequence
            tap = tap * (offs >= lag).to(xs.dtype)[None, :, None]
        y = torch.addcmul(y, tap, weight[:, j])
    return F.silu(y)


def _load():
    """The compiled kernels, or None (after one warning) when numba cannot load."""
    global _kernel, _failed
    if _kernel is None and not _failed:
        try:
            _kernel = importlib.import_module("linattn.kernels.cpu_conv")
        except Exception as exc:  # ImportError, or a numba/llvmlite that fails to initialize
            _failed = True
            warnings.warn(f"linattn: compiled convolution unavailable ({type(exc).__name__}: {exc}); using torch",
                          RuntimeWarning, stacklevel=3)
    return _kernel


class _CompiledConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xs, weight, offs, kernel):
        B, TK, C = xs.shape
        K = weight.shape[-1]
        xs_c, wT = xs.detach().contiguous(), weight.detach().t().contiguous()
        off = offs.numpy() if offs is not None else _NO_OFFSETS
        pre = torch.empty(B, TK - K + 1, C, dtype=xs.dtype)
        kernel.forward(xs_c.numpy(), wT.numpy(), off, offs is not None, pre.numpy())
        sig = torch.sigmoid(pre)
        ctx.save_for_backward(xs, weight, pre, sig)
        ctx.offs, ctx.kernel, ctx.arrays = offs, kernel, (xs_c, wT)  # the contiguous copies the backward reads too
        return pre * sig

    @staticmethod
    def backward(ctx, gy):
        xs, weight, pre, sig = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiate the torch form, so higher derivatives are exact
            wanted = [t for t in (xs, weight) if t.requires_grad]
            got = iter(torch.autograd.grad(conv_torch(xs, weight, ctx.offs), wanted, gy, create_graph=True))
            return (next(got) if xs.requires_grad else None), (next(got) if weight.requires_grad else None), None, None
        gxs = torch.empty_like(xs, memory_format=torch.contiguous_format)
        gwT = torch.empty(weight.shape[1], weight.shape[0], dtype=weight.dtype)
        off = ctx.offs.numpy() if ctx.offs is not None else _NO_OFFSETS
        xs_c, wT = ctx.arrays
        gy = gy.resolve_neg().contiguous()  # autograd may hand a negative view, whose memory holds -gy
        ctx.kernel.backward(xs_c.numpy(), wT.numpy(), off,
                            ctx.offs is not None, pre.numpy(), sig.numpy(), gy.numpy(), gxs.numpy(),
                            gwT.numpy())
        return gxs, gwT.t(), None, None


_NO_OFFSETS = torch.zeros(1, dtype=torch.int64).numpy()
