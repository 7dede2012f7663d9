"""The short causal convolution (depthwise, with SiLU) that fla's and Qwen3-Next's linear layers put before q, k
and v (Mamba-2's and LFM2's with a bias, LFM2's without the SiLU): a torch form (any dtype and device, any order
of derivative) and, for float32 CPU tensors, one compiled pass each way (`linattn.kernels.cpu_conv`); a double
backward recomputes in the torch form. Outside autograd the compiled pass reads x where it lies (channels adjacent
in memory, as HF's transposed ``[B, C, T]`` view), the history apart (no concatenated copy), applies the SiLU
itself and splits the tokens over the threads torch is allowed. `conv_update` runs one decode token through a
rolling window of inputs in place. Which runs is `linattn.backends`' decision (``backend=`` as everywhere in linattn).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.graph import increment_version

from linattn import backends
from linattn.backends import cpu as cpu_backend
from linattn.buffers import array, readable, values


def sequence_offsets(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """Position of every packed token inside its own sequence, ``[T]``."""
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
    return torch.arange(T, device=cu.device) - cu[:-1][rows]


ACTIVATIONS = ("silu", None)


def causal_conv(x, weight, history=None, cu_seqlens=None, *, bias=None, activation="silu", backend="auto"):
    """Depthwise causal convolution: ``y_t = act(bias + sum_j w[:, j] x_{t-K+1+j})``.

    Args:
        x: input ``[B, T, C]``.
        weight: taps ``[C, K]``, the last one on the current token.
        history: the K-1 inputs before x ``[B, K-1, C]`` (zeros if None), e.g. a decode cache's.
        cu_seqlens: packed sequences (as in `linattn.linear_attention`): no tap reaches into the previous one.
        bias: ``[C]`` or None.
        activation: ``"silu"`` (default) or None.
        backend: ``"auto"`` (the compiled pass where it takes the call, else the torch form), ``"torch"``,
            ``"cpu"`` (the compiled pass, or a ``ValueError`` saying why not) or ``"triton"`` (the torch form: the
            Triton backend has no convolution).

    Returns:
        ``(y [B, T, C], the new history [B, K-1, C]: the last K-1 inputs)``.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be \"silu\" or None, got {activation!r}")
    B, T, C = x.shape
    K = weight.shape[-1]
    silu = activation == "silu"
    offs = None if cu_seqlens is None else sequence_offsets(cu_seqlens, T)
    plan = backends.plan_conv(backend, x, weight, bias)
    if plan.kernel == "cpu" and not (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, weight, bias, history))):
        # Outside autograd: x read where it lies, the history read apart (no concatenated copy), SiLU in the pass
        y = cpu_backend.conv_forward(x, history, weight, bias, offs, silu)
        return y, _tail(x, history, K)
    if history is None:
        history = x.new_zeros(B, K - 1, C)
    xs = torch.cat([history.to(x.dtype), x], dim=1)  # [B, K-1+T, C]
    tail = xs[:, T:] if K > 1 else xs[:, :0]
    if plan.kernel == "cpu":
        return _CompiledConv.apply(xs, weight, bias, offs, silu, cpu_backend.kernel("cpu_conv")), tail
    return conv_torch(xs, weight, offs, bias, silu), tail


def _tail(x: torch.Tensor, history: torch.Tensor | None, K: int) -> torch.Tensor:
    """The last K-1 inputs of history then x, ``[B, K-1, C]`` (zeros before the first input)."""
    B, T, C = x.shape
    if T >= K - 1:
        return x[:, T - (K - 1):].clone()
    before = x.new_zeros(B, K - 1 - T, C) if history is None else history[:, T:].to(x.dtype)
    return torch.cat([before, x], dim=1)


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
                activation: str | None = "silu", backend: str = "auto") -> torch.Tensor | None:
    """One decode token: ``window [B, C, W]`` (W >= K: the last W inputs, oldest first, HF's conv cache layout)
    shifts by one and takes ``x [B, C]`` in place; returns ``act(bias + w . window[..., W-K:])`` ``[B, C]``. None
    when the compiled update does not take the call under ``backend="auto"`` (not a CPU float32/float64 call with
    one dtype throughout, outside autograd; the caller then runs its own code); a forced ``"cpu"`` raises the
    ``ValueError`` that says why."""
    dtype = window.dtype
    B, C, W = window.shape
    if (activation not in ACTIVATIONS or x.shape != (B, C) or weight.dim() != 2 or weight.shape[0] != C
            or not 1 <= weight.shape[1] <= W or (window.is_inference() and not torch.is_inference_mode_enabled())):
        return None
    if backends.plan_conv(backend, x, weight, bias, window=window).kernel is None:
        return None
    kernel = cpu_backend.kernel("cpu_conv")
    out = torch.empty(B, C, dtype=dtype)
    b = readable(bias) if bias is not None else array(torch.zeros(C, dtype=dtype))
    # NumPy views that leave the caller's tensors resizable (x.numpy() would pin their storage for good)
    kernel.update(readable(x), array(window.detach()), readable(weight), b, activation == "silu", array(out))
    torch.autograd.graph.increment_version(window)  # written through a raw view: autograd must know
    return out


_Tensor, _Parameter, _F32, _BF16 = torch.Tensor, torch.nn.Parameter, torch.float32, torch.bfloat16
_empty, _grad_enabled, _inference_mode = torch.empty, torch.is_grad_enabled, torch.is_inference_mode_enabled
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def fast_update(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                silu: bool) -> torch.Tensor | None:
    """HF's ``causal_conv1d_update`` of one token in one compiled call, or None (nothing written) when the call is
    not the plain case: ``x [B, C, 1]`` (any strides), ``window [B, C, W]`` contiguous (W >= K - 1; the taps read
    its last K - 1 entries and x, then it shifts by one and takes x, in place), ``weight [C, K]`` and ``bias [C]``
    (or None) contiguous, all float32 or all bfloat16 CPU tensors outside autograd. Returns ``act(bias + taps)``
    ``[B, C, 1]`` in x's dtype, rounded as HF's bfloat16 convolution and SiLU round (the sum to bfloat16, then
    the SiLU of that). A decode step at batch 1 is all overhead around 5376 x 4 multiply-adds, so the proof is
    attribute reads only (each ~50 ns, a torch op ~1 us); anything unusual goes to the caller's checked path."""
    if not (type(x) is _Tensor and type(window) is _Tensor and (type(weight) is _Tensor or type(weight) is _Parameter)
            and (bias is None or type(bias) is _Tensor or type(bias) is _Parameter)):
        return None
    dtype = x.dtype
    if not ((dtype is _F32 or dtype is _BF16) and window.dtype is dtype and weight.dtype is dtype
            and (bias is None or bias.dtype is dtype)):
        return None
    if not (x.is_cpu and window.is_cpu and weight.is_cpu and (bias is None or bias.is_cpu)):
        return None
    if (x.is_neg() or window.is_neg() or weight.is_neg() or (bias is not None and bias.is_neg())
            or (_transforms_active is not None and _transforms_active())):
        return None
    if _grad_enabled() and (x.requires_grad or window.requires_grad or weight.requires_grad
                            or (bias is not None and bias.requires_grad)):
        return None
    x_shape, k_shape = x.shape, weight.shape
    if len(x_shape) != 3 or x_shape[2] != 1 or len(k_shape) != 2 or x_shape[1] != (C := k_shape[0]):
        return None
    K = k_shape[1]
    B = x_shape[0]
    w_shape = window.shape
    if (len(w_shape) != 3 or w_shape[0] != B or w_shape[1] != C or (W := w_shape[2]) < 1 or W < K - 1 or K < 1
            or not B or not C or not window.is_contiguous() or not weight.is_contiguous()
            or (bias is not None and (bias.shape != (C,) or not bias.is_contiguous()))):
        return None
    if window.is_inference() and not _inference_mode():
        return None  # HF's in-place copy raises there: the checked path gives that error
    x_at, win_at = x.data_ptr(), window.data_ptr()
    if win_at <= x_at < win_at + B * C * W * dtype.itemsize:
        return None  # a token inside the window would be overwritten while it is read: HF's copy-first path
    conv = cpu_backend.kernel("cpu_conv")
    if conv is None:
        return None
    out = _empty((B, C, 1), dtype=dtype)
    conv.update_hf(x_at, x.stride(0), x.stride(1), win_at, B, C, W, weight.data_ptr(), K,
                   0 if bias is None else bias.data_ptr(), out.data_ptr(), 1 if silu else 0,
                   0 if dtype is _F32 else 1)
    increment_version(window)  # written through a raw address: autograd must know
    return out


class _CompiledConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xs, weight, bias, offs, silu, kernel):
        B, TK, C = xs.shape
        K = weight.shape[-1]
        xs_c, wT = values(xs.detach()).contiguous(), values(weight.detach()).t().contiguous()
        b = values(bias.detach()).contiguous() if bias is not None else torch.zeros(C, dtype=xs.dtype)
        off = offs.numpy() if offs is not None else _NO_OFFSETS
        T = TK - K + 1
        pre, y = torch.empty(B, T, C, dtype=xs.dtype), torch.empty(B, T, C, dtype=xs.dtype)
        hist = xs_c[:, :K - 1].contiguous() if K > 1 else torch.zeros(1, 1, 1, dtype=xs.dtype)
        kernel.forward(xs_c[:, K - 1:].data_ptr(), TK * C, C, B, array(hist), K > 1, array(wT), array(b), off,
                       offs is not None, silu, 0, T, array(y), array(pre), True)
        ctx.save_for_backward(xs, weight, bias, pre)
        ctx.offs, ctx.silu, ctx.kernel, ctx.arrays = offs, silu, kernel, (xs_c, wT)  # the backward reads them too
        return y

    @staticmethod
    def backward(ctx, gy):
        xs, weight, bias, pre = ctx.saved_tensors
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
        ctx.kernel.backward(array(xs_c), array(wT), off, ctx.offs is not None, ctx.silu, array(pre),
                            readable(gy.contiguous()), array(gxs), array(gwT), array(gb))
        return gxs, gwT.t(), (gb if bias is not None else None), None, None, None


_NO_OFFSETS = torch.zeros(1, dtype=torch.int64).numpy()
_NO_PRE = torch.zeros(1, 1, 1).numpy()
