"""The short causal convolution (depthwise, with SiLU) that fla's and Qwen3-Next's linear layers put before q, k
and v (Mamba-2's and LFM2's with a bias, LFM2's without the SiLU): a torch form (any dtype and device, any order
of derivative) and, for float32 CPU tensors, one compiled pass each way
(:mod:`linattn.kernels.cpu_conv`); a double backward recomputes in the torch form. :func:`conv_update` runs one
decode token through a rolling window of inputs in place."""

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


ACTIVATIONS = ("silu", None)


def causal_conv(x, weight, history=None, cu_seqlens=None, *, bias=None, activation="silu"):
    """Depthwise causal convolution: ``y_t = act(bias + sum_j w[:, j] x_{t-K+1+j})``, x ``[B, T, C]``,
    weight ``[C, K]``, bias ``[C]`` or None, activation ``"silu"`` (default) or None. ``history [B, K-1, C]`` is
    the input before x (zeros if None); with ``cu_seqlens`` no tap reaches into the previous sequence. Returns
    (y, the new history: the last K-1 inputs)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    B, T, C = x.shape
    K = weight.shape[-1]
    if history is None:
        history = x.new_zeros(B, K - 1, C)
    xs = torch.cat([history.to(x.dtype), x], dim=1)  # [B, K-1+T, C]
    tail = xs[:, T:] if K > 1 else xs[:, :0]
    offs = None if cu_seqlens is None else sequence_offsets(cu_seqlens, T)
    # The compiled pass reads raw memory, which torch.func wrappers lack: under a transform the torch form runs.
    plain = (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
             and (bias is None or bias.dtype == x.dtype) and not functorch_active())
    kernel = _load() if plain else None
    silu = activation == "silu"
    if kernel is not None:
        return _CompiledConv.apply(xs, weight, bias, offs, silu, kernel), tail
    return conv_torch(xs, weight, offs, bias, silu), tail


def conv_torch(xs: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor | None, bias: torch.Tensor | None = None,
               silu: bool = True) -> torch.Tensor:
    """The torch form on the history-prefixed input ``xs [B, K-1+T, C]``: K shifted multiply-adds, the bias, then
    SiLU (``silu``)."""
    K = weight.shape[-1]
    T = xs.shape[1] - K + 1
    y = xs[:, K - 1:] * weight[:, K - 1]
    if bias is not None:
        y = y + bias
    for j in range(K - 1):
        lag = K - 1 - j  # tap j reads token t - lag
        tap = xs[:, j:j + T]
        if offs is not None:  # no tap reaches into the previous sequence
            tap = tap * (offs >= lag).to(xs.dtype)[None, :, None]
        y = torch.addcmul(y, tap, weight[:, j])
    return F.silu(y) if silu else y


def conv_update(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                activation: str | None = "silu") -> torch.Tensor | None:
    """One decode token: ``window [B, C, W]`` (W >= K: the last W inputs, oldest first, HF's conv cache layout)
    shifts by one and takes ``x [B, C]`` in place; returns ``act(bias + w . window[..., W-K:])`` ``[B, C]``. None
    when the compiled update does not take the call (not a CPU float32/float64 call with one dtype throughout,
    outside autograd; the caller then runs its own code)."""
    dtype = window.dtype
    B, C, W = window.shape
    if (activation not in ACTIVATIONS or dtype not in (torch.float32, torch.float64) or window.device.type != "cpu"
            or x.dtype != dtype or weight.dtype != dtype or (bias is not None and bias.dtype != dtype)
            or x.shape != (B, C) or weight.dim() != 2 or weight.shape[0] != C or not 1 <= weight.shape[1] <= W
            or functorch_active() or (torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (x, window, weight, bias)))
            or (window.is_inference() and not torch.is_inference_mode_enabled())):
        return None
    kernel = _load()
    if kernel is None:
        return None
    out = torch.empty(B, C, dtype=dtype)
    b = bias.detach() if bias is not None else torch.zeros(C, dtype=dtype)
    kernel.update(x.detach().numpy(), window.detach().numpy(), weight.detach().numpy(), b.numpy(),
                  activation == "silu", out.numpy())
    torch.autograd.graph.increment_version(window)  # written through numpy: autograd must know
    return out


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
    def forward(ctx, xs, weight, bias, offs, silu, kernel):
        B, TK, C = xs.shape
        K = weight.shape[-1]
        xs_c, wT = xs.detach().contiguous(), weight.detach().t().contiguous()
        b = bias.detach().contiguous() if bias is not None else torch.zeros(C, dtype=xs.dtype)
        off = offs.numpy() if offs is not None else _NO_OFFSETS
        pre = torch.empty(B, TK - K + 1, C, dtype=xs.dtype)
        kernel.forward(xs_c.numpy(), wT.numpy(), b.numpy(), off, offs is not None, pre.numpy())
        sig = torch.sigmoid(pre) if silu else pre
        ctx.save_for_backward(xs, weight, bias, pre, sig)
        ctx.offs, ctx.silu, ctx.kernel, ctx.arrays = offs, silu, kernel, (xs_c, wT)  # the backward reads them too
        return pre * sig if silu else pre.clone()

    @staticmethod
    def backward(ctx, gy):
        xs, weight, bias, pre, sig = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiate the torch form, so higher derivatives are exact
            inputs = (xs, weight, bias)
            wanted = [t for t in inputs if t is not None and t.requires_grad]
            got = iter(torch.autograd.grad(conv_torch(xs, weight, ctx.offs, bias, ctx.silu), wanted, gy,
                                           create_graph=True))
            return (*(next(got) if t is not None and t.requires_grad else None for t in inputs), None, None, None)
        C = weight.shape[0]
        gxs = torch.empty_like(xs, memory_format=torch.contiguous_format)
        gwT = torch.empty(weight.shape[1], C, dtype=weight.dtype)
        gb = torch.empty(C, dtype=xs.dtype)
        off = ctx.offs.numpy() if ctx.offs is not None else _NO_OFFSETS
        xs_c, wT = ctx.arrays
        ctx.kernel.backward(xs_c.numpy(), wT.numpy(), off, ctx.offs is not None, ctx.silu, pre.numpy(),
                            sig.numpy(), gy.contiguous().numpy(), gxs.numpy(), gwT.numpy(), gb.numpy())
        return gxs, gwT.t(), (gb if bias is not None else None), None, None, None


_NO_OFFSETS = torch.zeros(1, dtype=torch.int64).numpy()
