"""The short causal convolution of every family (and LFM2's): HF's ``causal_conv1d_fn`` (prefill) and
``causal_conv1d_update`` (one decode token) on `linattn.nn.causal_conv` (compiled on CPU, restarting at
packed boundaries) and `linattn.nn.conv.conv_update` (the cache's window updated in place)."""

from __future__ import annotations

import inspect

import torch

from linattn.checks import check_cu_seqlens
from linattn.integrations.transformers.common import on_linattn, packed_boundaries
from linattn.nn.conv import causal_conv, conv_torch, conv_update, fast_update

_ACTIVATIONS = {None: None, "silu": "silu", "swish": "silu"}


def _boundaries(kwargs: dict, L: int, B: int, device) -> torch.Tensor | None:
    """``cu_seqlens`` of a packed call over all L inputs: the inputs HF's cache puts in front of the call's own
    tokens join the first sequence. None when the call is not packed."""
    for name in ("cu_seq_lens_q", "cu_seqlens", "seq_idx"):
        cu = kwargs.get(name)
        if cu is None:
            continue
        if name == "seq_idx":
            T = cu.shape[-1] if isinstance(cu, torch.Tensor) and cu.dim() == 2 else L
            cu = packed_boundaries({"seq_idx": cu}, T, B, device)
        readable = isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.numel() and not (cu.is_meta or cu.is_complex())
        end = int(cu[-1]) if readable else L
        try:  # the API's rule, under the name HF passes it by
            cu = check_cu_seqlens(cu, end if 0 <= end <= L else L, B, device)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
        if L > int(cu[-1]):
            cu = torch.cat([cu[:1], cu[1:] + (L - int(cu[-1]))])
        return cu
    return None


def causal_conv1d_fn(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     activation: str | None = None, *, backend: str = "auto", fallback=None, **kwargs) -> torch.Tensor:
    """HF's ``causal_conv1d_fn``: depthwise causal convolution of ``hidden_states [B, C, L]`` with ``weight [C,
    K]``, ``bias [C]``, then SiLU (``activation="silu"``/``"swish"``) or nothing (None). With ``cu_seq_lens_q``,
    ``cu_seqlens`` or ``seq_idx`` no tap reaches into the previous sequence (inputs before the last boundary's
    span, which HF's cache puts in front, are the first sequence's past). Returns ``[B, C, L]`` in
    ``hidden_states``' dtype. Another activation goes to HF's own torch code (an error for a packed call)."""
    if not on_linattn(backend, fallback, hidden_states):
        return fallback(hidden_states, weight, bias, activation=activation, **kwargs)
    B, C, L = hidden_states.shape
    cu = _boundaries(kwargs, L, B, hidden_states.device)
    if activation not in _ACTIVATIONS:
        if cu is None and fallback is not None:
            return inspect.unwrap(fallback)(hidden_states, weight, bias, activation=activation)
        raise ValueError(f"activation={activation!r}: linattn's short convolution is SiLU or none")
    y, _ = causal_conv(hidden_states.transpose(1, 2).to(weight.dtype), weight, cu_seqlens=cu, bias=bias,
                       activation=_ACTIVATIONS[activation], backend=backend)
    return y.transpose(1, 2).to(hidden_states.dtype)


def causal_conv1d_update(hidden_states: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, activation: str | None = None, *, backend: str = "auto",
                         fallback=None) -> torch.Tensor:
    """HF's ``causal_conv1d_update``: ``hidden_states [B, C, L]`` (L = 1 in decode) after the inputs held in
    ``conv_state [B, C, W]`` (W >= K - 1), which takes the last W inputs in place. Returns ``[B, C, L]`` in
    ``hidden_states``' dtype. One token, all float32 or all bfloat16, outside autograd runs one compiled call
    (`linattn.nn.conv.fast_update`); float64 the compiled update too."""
    if (backend == "auto" or backend == "cpu") and (activation is None or activation == "silu"
                                                    or activation == "swish"):
        out = fast_update(hidden_states, conv_state, weight, bias, activation is not None)
        if out is not None:
            return out
    if not on_linattn(backend, fallback, hidden_states):
        return fallback(hidden_states, conv_state, weight, bias, activation)
    if activation not in _ACTIVATIONS:
        if fallback is not None:
            return inspect.unwrap(fallback)(hidden_states, conv_state, weight, bias, activation)
        raise ValueError(f"activation={activation!r}: linattn's short convolution is SiLU or none")
    act = _ACTIVATIONS[activation]
    B, C, L = hidden_states.shape
    W, K = conv_state.shape[-1], weight.shape[-1]
    if L == 1:
        out = conv_update(hidden_states[:, :, 0], conv_state, weight, bias, act, backend=backend)
        if out is not None:
            return out[:, :, None].to(hidden_states.dtype)
    xs = torch.cat([conv_state, hidden_states], dim=-1).to(weight.dtype)  # [B, C, W + L]
    conv_state.copy_(xs[:, :, -W:])
    y = conv_torch(xs[:, :, W + 1 - K:].transpose(1, 2), weight, None, bias, act == "silu")
    return y.transpose(1, 2).to(hidden_states.dtype)
