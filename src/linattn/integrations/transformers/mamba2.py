"""Mamba-2's state-space duality layer (Mamba-2, Bamba, Granite 4 hybrid, Falcon-H1, Nemotron-H, Zamba2) on the
gated rule: HF's ``mamba2_chunk_scan`` (prefill), ``mamba2_selective_state_update`` (one decode token) and
``mamba2_split_conv1d_scan_combined`` (the fused training kernel; on linattn it returns None, so that the layer
runs its unfused path, whose convolution and scan are patched too).

With dt_t = clamp(softplus(dt_t + dt_bias), dt_limit) per head, the layer is
S_t = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T,  y_t = S_t^T C_t + D x_t
with S ``[N, P]`` per head (state size N, head dim P): linattn's gated rule with g = dt A, k = B, q = C,
v = dt x, no normalizer, scale 1, B and C shared by the heads of a group (grouped value heads). HF's state is
``[B, H, P, N]``, linattn's ``[B, H, N, P]``: the final state is returned as the transposed view of linattn's, so
a cache that HF fills from it (``zeros_like`` keeps the strides) holds linattn's layout and a decode step updates
it in place with one compiled call; a state in HF's own layout is updated in place too, through a copy.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

import linattn
from linattn import buffers
from linattn.integrations.transformers.common import decoder, on_linattn, packed_boundaries
from linattn.state import State


def _time_step(dt, dt_bias, dt_softplus, dt_limit):
    """HF's order: bias, softplus, then the clamp, in dt's own dtype."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_limit is not None:
        dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    return dt


def mamba2_chunk_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, chunk_size: int = 256, D: torch.Tensor | None = None,
                      dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
                      dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
                      return_final_states: bool = False, *, backend: str = "auto", fallback=None, **kwargs):
    """HF's ``mamba2_chunk_scan``: hidden_states ``[B, T, H, P]``, dt ``[B, T, H]``, A ``[H]``, B, C
    ``[B, T, G, N]``, D ``[H]``, dt_bias ``[H]``, initial_states ``[B, H, P, N]`` (N entries for a packed call:
    ``seq_idx``, ``cu_seqlens`` or ``cu_seq_lens_q`` in ``kwargs``). Returns y ``[B, T, H, P]`` in float32
    (float64 for float64 inputs), and with ``return_final_states`` the final state ``[B, H, P, N]``.
    ``chunk_size`` is HF's and does not change the result; linattn picks its own."""
    if not on_linattn(backend, fallback, hidden_states):
        return fallback(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, initial_states=initial_states,
                        dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=return_final_states, **kwargs)
    batch, T = hidden_states.shape[:2]
    cd = torch.float64 if hidden_states.dtype == torch.float64 else torch.float32
    dt = _time_step(dt, dt_bias, dt_softplus, dt_limit).to(cd)
    x = hidden_states.to(cd)
    cu = packed_boundaries(kwargs, T, batch, x.device)
    S0 = None if initial_states is None else State(initial_states.to(cd).transpose(-1, -2))
    tracked = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden_states, dt, A, B, C, D, initial_states))
    if tracked or x.device.type != "cpu":
        v = x * dt[..., None]
    else:  # one pass into a buffer advised onto huge pages (at 80 heads of 64, T = 4096: 84 MB, faulted per call)
        v = torch.mul(x, dt[..., None], out=buffers.empty(tuple(x.shape), cd))
    o, state = linattn.linear_attention(
        C.to(cd), B.to(cd), v, rule="gated", g=dt * A.to(cd), normalize=False, scale=1.0,
        initial_state=S0, output_final_state=return_final_states, cu_seqlens=cu, backend=backend)
    if D is not None:
        skip = D.to(cd)[:, None] if D.dim() == 1 else D.to(cd)
        # outside autograd the output is linattn's fresh tensor: the skip term is added where it lies
        o = o + skip * x if tracked else o.addcmul_(skip, x)
    if return_final_states:
        return o, state.S.transpose(-1, -2)
    return o


def _per_head(t: torch.Tensor | None, name: str, index) -> torch.Tensor | None:
    """The per-head values of a tensor that HF's layer expands over the head dim (and state size): ``t[index]``,
    or a ValueError when its values differ along the expanded dims (the rule has one gate per head)."""
    if t is None:
        return None
    head = t[index]
    if all(t.stride(d) == 0 for d in range(head.dim(), t.dim())) or torch.equal(
            t, head.reshape(*head.shape, *[1] * (t.dim() - head.dim())).expand_as(t)):
        return head
    raise ValueError(f"{name}: its values vary along the head dim; the scan has one value per head")


def mamba2_selective_state_update(state: torch.Tensor, hidden_states: torch.Tensor, dt: torch.Tensor,
                                  A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None,
                                  dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                                  z: torch.Tensor | None = None, *, backend: str = "auto", fallback=None, **kwargs):
    """HF's ``mamba2_selective_state_update``: state ``[B, H, P, N]`` (updated in place), hidden_states ``[B, H,
    P]``, dt ``[B, H, P]``, A ``[H, P, N]``, dt_bias and D ``[H, P]`` (expanded from one value per head, as
    HF's layers pass them), B, C ``[B, G, N]``, z ``[B, H, P]`` (the output is multiplied by silu(z)). Returns
    y ``[B, H, P]`` in hidden_states' dtype. Per-head values that vary along the head dim go to HF's torch code."""
    if not on_linattn(backend, fallback, hidden_states):
        return fallback(state, hidden_states, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z,
                        **kwargs)
    try:
        dt_h = _per_head(dt, "dt", (slice(None), slice(None), 0))
        A_h = _per_head(A, "A", (slice(None), 0, 0))
        D_h = _per_head(D, "D", (slice(None), 0))
        bias_h = _per_head(dt_bias, "dt_bias", (slice(None), 0))
    except ValueError:
        if fallback is None:
            raise
        return inspect.unwrap(fallback)(state, hidden_states, dt, A, B, C, D=D, dt_bias=dt_bias,
                                        dt_softplus=dt_softplus, z=z)
    cd = torch.float64 if state.dtype == torch.float64 else torch.float32
    dt_h = _time_step(dt_h, bias_h, dt_softplus, None).to(cd)
    x = hidden_states.to(cd)
    q, k, v, g = C.to(cd).contiguous(), B.to(cd).contiguous(), x * dt_h[..., None], dt_h * A_h.to(cd)
    S = state.transpose(-1, -2)  # linattn's [B, H, N, P] view of HF's state
    dec = decoder(state, S, (q, k, v, g), "gated", None, 1.0, backend, normalize=False) if S.dtype == cd else None
    if dec is not None:
        o = dec(q, k, v, g)
    else:  # autograd records, or the state is not in the accumulation dtype: HF's own in-place write
        o, new = linattn.step(q, k, v, State(S.to(cd)), rule="gated", g=g, normalize=False, scale=1.0,
                              backend=backend)
        state.copy_(new.S.transpose(-1, -2))
    if D_h is not None:
        o = o + D_h.to(cd)[:, None] * x
    if z is not None:
        o = o * F.silu(z.to(cd))
    return o.to(hidden_states.dtype)


def mamba2_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                      initial_states=None, dt_limit=(0.0, float("inf")), return_final_states=False,
                                      *args, backend: str = "auto", fallback=None, **kwargs):
    """HF's fused training kernel: on linattn, None (as HF's own torch function returns), so that the layer runs
    its unfused path; off the CPU with ``backend="auto"``, the function HF chose."""
    if not on_linattn(backend, fallback, zxbcdt):
        return fallback(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, dt_limit,
                        return_final_states, *args, **kwargs)
    return None
