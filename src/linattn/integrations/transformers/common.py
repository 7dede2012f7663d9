"""What every adapter shares: whether a call runs on linattn or goes to the function HF chose, packed-sequence
boundaries from the names HF passes them by, the decoder kept per state tensor of HF's cache, and the kernel module
a one-call decode step uses."""

from __future__ import annotations

import torch

from linattn import backends
from linattn.backends import cpu as cpu_backend
from linattn.backends import policy
from linattn.checks import check_cu_seqlens
from linattn.decode import decoder_for


def on_linattn(backend: str, fallback, *tensors: torch.Tensor) -> bool:
    """Whether this call runs on linattn: a forced backend always does; ``"auto"`` does on CPU tensors (or when
    there is no HF function to go to); elsewhere (CUDA) the call goes to what HF chose."""
    if backend != "auto" or fallback is None:
        return True
    return all(t.device.type == "cpu" for t in tensors if isinstance(t, torch.Tensor))


def packed_boundaries(kwargs: dict, T: int, B: int, device) -> torch.Tensor | None:
    """``cu_seqlens [N + 1]`` of a packed call from what HF passes (``cu_seqlens``, ``cu_seq_lens_q``, or
    Mamba's ``seq_idx [1, T]``, the sequence number of every token), checked as the API checks it; None when the
    call is not packed."""
    for name in ("cu_seqlens", "cu_seq_lens_q"):
        cu = kwargs.get(name)
        if cu is not None:
            try:
                return check_cu_seqlens(cu, T, B, device)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{name}: {exc}") from None
    seq_idx = kwargs.get("seq_idx")
    if seq_idx is None:
        return None
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.dtype.is_floating_point or seq_idx.shape != (1, T) or B != 1:
        raise ValueError(f"seq_idx: expected an integer tensor [1, T] = [1, {T}] with batch size 1, got "
                         f"{getattr(seq_idx, 'shape', type(seq_idx).__name__)} at batch size {B}")
    idx = seq_idx[0].to(torch.int64)
    if T and (idx[1:] < idx[:-1]).any():
        raise ValueError("seq_idx: must be nondecreasing along the sequence")
    starts = torch.nonzero(idx[1:] != idx[:-1]).flatten() + 1
    return torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), T)]).to(torch.int32).to(device)


def decoder(key: torch.Tensor, S: torch.Tensor, inputs, rule: str, feature_map, scale, backend, normalize=None):
    """The decoder that updates ``S`` (linattn's view of HF's state tensor ``key``) in place for this step, or
    None where the step must not write it: autograd records (grad enabled and an input or S requiring grad), S is
    not in the accumulation dtype (float32; S's own for float64 inputs, as the functional path), S holds inference
    tensors outside inference mode, or an in-place step refuses S's memory."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*inputs, S)):
        return None
    if (inputs[0].dtype != torch.float64 and S.dtype != torch.float32) or (
            S.is_inference() and not torch.is_inference_mode_enabled()):
        return None
    try:  # one Decoder kept per HF state tensor (linattn.decode.decoder_for), rebuilt when S was re-pointed
        return decoder_for(key, S, rule=rule, feature_map=feature_map, scale=scale, normalize=normalize,
                           backend=backend)
    except ValueError:  # memory or inference tensors an in-place step refuses: the functional path
        return None


def step_kernel(slot: list, name: str, backend: str):
    """The compiled kernel module ``name`` (``cpu_decode``, ``cpu_ssm``) an adapter's one-call decode step runs,
    loaded once into ``slot`` (the adapter's own list), or None when this call must take the checked path: the
    step's plan is not the compiled CPU step (numba missing, the policy's forms, a torch.func transform)."""
    if not slot:
        if backends.plan_step(backend).kernel != "cpu":
            return None
        slot.append(cpu_backend.kernel(name))
    kd = slot[0]
    if kd is None or (backend == "auto" and "step" not in policy.AUTO_FORMS) or backends.functorch_active():
        return None
    return kd
