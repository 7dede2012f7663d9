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
it in place with one compiled call; a state in HF's own layout is updated in place too.

A decode step on CPU (float32 or bfloat16 inputs, a float32 state in either layout, outside autograd) runs in one
compiled call (`linattn.kernels.cpu_ssm`): the time step, the state update, the read, D and the z gate in one pass
over the state. `decode_plan` says whether a step takes it, and why not; a step that does not runs the time step
and the gates in torch around `linattn.step` (a Decoder kept per state tensor; a state in HF's own layout through
a copy).
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch.autograd.graph import increment_version
from torch.utils.weak import WeakIdKeyDictionary

import linattn
from linattn import backends, buffers
from linattn.backends import policy
from linattn.integrations.transformers.common import decoder, on_linattn, packed_boundaries, step_kernel
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
    g, q, k = dt * A.to(cd), C.to(cd), B.to(cd)
    # (the policy's length and grouping first: a short prefill skips the plan's checks, which linear_attention repeats)
    if not tracked and cu is None and x.device.type == "cpu" and policy.grouped_chunk(T, x.shape[2] // q.shape[2]):
        plan = linattn.plan(linattn.linear_attention, q, k, x, rule="gated", g=g, normalize=False, scale=1.0,
                            initial_state=S0, output_final_state=return_final_states, backend=backend)
        if plan.grouped_chunk:  # dt and D ride on the chunk form's passes: no dt x buffer, no pass for D x
            state = torch.zeros(batch, x.shape[2], q.shape[-1], x.shape[-1], dtype=cd) if S0 is None else S0.S
            o, S = backends.cpu.grouped_prefill(q, k, x, g, state, 1.0, v_scale=dt, skip=D)
            return (o, S.transpose(-1, -2)) if return_final_states else o
    if tracked or x.device.type != "cpu":
        v = x * dt[..., None]
    else:  # one pass into a buffer advised onto huge pages (at 80 heads of 64, T = 4096: 84 MB, faulted per call)
        v = torch.mul(x, dt[..., None], out=buffers.empty(tuple(x.shape), cd))
    o, state = linattn.linear_attention(
        q, k, v, rule="gated", g=g, normalize=False, scale=1.0,
        initial_state=S0, output_final_state=return_final_states, cu_seqlens=cu, backend=backend)
    if D is not None:
        skip = D.to(cd)[:, None] if D.dim() == 1 else D.to(cd)
        # outside autograd the output is linattn's fresh tensor: the skip term is added where it lies
        o = o + skip * x if tracked else o.addcmul_(skip, x)
    if return_final_states:
        return o, state.S.transpose(-1, -2)
    return o


def _check_per_head(t: torch.Tensor, name: str, shape: tuple, lead: int) -> None:
    """That ``t`` (dt ``[B, H, P]``, A ``[H, P, N]`` or dt_bias ``[H, P]``: HF's expansions of one value per head,
    the head dim at ``lead``) has ``shape`` (None: any size there) and one value per head: proven by the strides
    where HF's ``expand`` left them (stride 0 or size 1 after the head dim: attribute reads only), else by
    comparing the values. A ValueError names ``t`` when its shape is not HF's or its values vary along the head
    dim (the rule has one gate per head)."""
    got = t.shape
    if len(got) != len(shape) or any(n is not None and n != m for n, m in zip(shape, got, strict=True)):
        want = "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"
        raise ValueError(f"{name}: expected HF's shape {want}, got shape {tuple(t.shape)}")
    strides = t.stride()
    if all(strides[d] == 0 or got[d] == 1 for d in range(lead + 1, len(got))):
        return
    head = t.as_strided((*got[:lead + 1], *[1] * (len(got) - lead - 1)), strides)
    if not torch.equal(t, head.expand_as(t)):
        raise ValueError(f"{name}: its values vary along the head dim; the scan has one value per head")


def _expanded(shape: torch.Size, dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None) -> bool:
    """Whether dt ``[B, H, P]``, A ``[H, P, N]`` and dt_bias ``[H, P]`` (or None) have HF's shapes for
    hidden_states' ``shape`` and strides 0 after the head dim, as HF's ``expand`` leaves them: then one value per
    head is proven by attribute reads alone (a few per step, where a generic check costs microseconds)."""
    if len(shape) != 3 or dt.shape != shape:
        return False
    P = shape[2]
    a_shape, a_strides = A.shape, A.stride()
    if not (len(a_shape) == 3 and a_shape[0] == shape[1] and a_shape[1] == P and a_strides[1] == 0
            and a_strides[2] == 0 and (dt.stride(2) == 0 or P == 1)):
        return False
    return dt_bias is None or (dt_bias.shape == shape[1:] and (dt_bias.stride(1) == 0 or P == 1))


def _broadcasts(shape: torch.Size, to: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, to) == to
    except RuntimeError:
        return False


# Per HF state tensor (weakly): its Decoder, the backend asked for, the Decoder's State and the tensor's address,
# shape and strides when the Decoder was found for it. A step on the same memory reuses it after attribute reads.
_LAYER_DECODERS = WeakIdKeyDictionary()


def _layer_decoder(state: torch.Tensor, inputs: tuple, backend: str):
    """The Decoder that updates HF's ``state`` in place (`common.decoder` on linattn's transposed view), or None
    where the step must not write it. Kept per state tensor: a later step finds it with attribute reads (no
    torch call) while nothing can record a graph and the tensor still lies in the memory it was found for."""
    held = _LAYER_DECODERS.get(state)
    if (held is not None and not torch.is_grad_enabled() and held[1] == backend and held[0].state is held[2]
            and state.data_ptr() == held[3] and state.shape == held[4] and state.stride() == held[5]
            and not (state.is_inference() and not torch.is_inference_mode_enabled())):
        return held[0]
    dec = decoder(state, state.transpose(-1, -2), inputs, "gated", None, 1.0, backend, normalize=False)
    if dec is not None:
        _LAYER_DECODERS[state] = (dec, backend, dec.state, state.data_ptr(), state.shape, state.stride())
    return dec


def mamba2_selective_state_update(state: torch.Tensor, hidden_states: torch.Tensor, dt: torch.Tensor,
                                  A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None,
                                  dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                                  z: torch.Tensor | None = None, *, backend: str = "auto", fallback=None, **kwargs):
    """HF's ``mamba2_selective_state_update``: state ``[B, H, P, N]`` (updated in place), hidden_states ``[B, H,
    P]``, dt ``[B, H, P]``, A ``[H, P, N]``, dt_bias ``[H, P]`` (expanded from one value per head, as HF's layers
    pass them), D ``[H, P]`` (or what broadcasts to hidden_states, as in HF's code), B, C ``[B, G, N]``, z ``[B,
    H, P]`` (the output is multiplied by silu(z)). Returns y ``[B, H, P]`` in hidden_states' dtype. Per-head
    values that vary along the head dim go to HF's torch code."""
    if backend == "auto" or backend == "cpu":  # the plain case, proven by attribute reads: one compiled call
        y = _fast_step(state, hidden_states, dt, A, B, C, D, dt_bias, dt_softplus, z, backend)
        if y is not None:
            return y
    if not on_linattn(backend, fallback, hidden_states):
        return fallback(state, hidden_states, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z,
                        **kwargs)
    shape = hidden_states.shape
    if not _expanded(shape, dt, A, dt_bias):  # not as HF's layers pass them: checked, maybe by value, or to HF
        try:
            if len(shape) != 3:
                raise ValueError(f"hidden_states: expected [B, H, P], got shape {tuple(hidden_states.shape)}")
            _check_per_head(dt, "dt", tuple(shape), 1)
            _check_per_head(A, "A", (shape[1], shape[2], None), 0)
            if dt_bias is not None:
                _check_per_head(dt_bias, "dt_bias", tuple(shape[1:]), 0)
        except ValueError:
            if fallback is None:
                raise
            return inspect.unwrap(fallback)(state, hidden_states, dt, A, B, C, D=D, dt_bias=dt_bias,
                                            dt_softplus=dt_softplus, z=z)
    if D is not None and D.shape != shape[1:] and not _broadcasts(D.shape, shape):
        raise ValueError(f"D: expected [H, P] = {tuple(hidden_states.shape[1:])} (or a shape that broadcasts to "
                         f"hidden_states' {tuple(hidden_states.shape)}), got shape {tuple(D.shape)}")
    plan = _plan(state, hidden_states, dt, A, B, C, D, dt_bias, z, backend)
    if plan.kernel is not None:
        return compiled_step(plan.module, state, hidden_states, dt, A, B, C, D, dt_bias, z, dt_softplus)
    batch, H = shape[0], shape[1]
    cd = torch.float64 if state.dtype == torch.float64 else torch.float32
    # One value per head, read as views (the checks above proved them; one torch call each: at batch 1 the
    # calls, not the arithmetic, are the cost), in HF's order and dt's dtype; casts only where dtypes differ
    dt_h = dt.as_strided((batch, H, 1), dt.stride())
    if dt_bias is not None:
        bias_h = dt_bias.as_strided((H, 1), dt_bias.stride())
        dt_h = dt_h + (bias_h if bias_h.dtype == dt_h.dtype else bias_h.to(dt_h.dtype))
    if dt_softplus:
        dt_h = F.softplus(dt_h)
    if dt_h.dtype != cd:
        dt_h = dt_h.to(cd)
    A_h = A.as_strided((H,), (A.stride(0),))
    x = hidden_states if hidden_states.dtype == cd else hidden_states.to(cd)
    q = (C if C.dtype == cd else C.to(cd)).contiguous()
    k = (B if B.dtype == cd else B.to(cd)).contiguous()
    v, g = x * dt_h, dt_h.view(batch, H) * (A_h if A_h.dtype == cd else A_h.to(cd))
    dec = _layer_decoder(state, (q, k, v, g), backend) if state.dtype == cd else None
    if dec is not None:  # o is the decoder's fresh output and no graph records: the rest writes into it
        o = dec(q, k, v, g)
        if D is not None:
            o += x * (D if D.dtype == cd else D.to(cd))
        if z is not None:
            o *= F.silu(z if z.dtype == cd else z.to(cd))
    else:  # autograd records, or the state is not in the accumulation dtype: HF's own in-place write
        S = state.transpose(-1, -2)  # linattn's [B, H, N, P] view of HF's state
        o, new = linattn.step(q, k, v, State(S.to(cd)), rule="gated", g=g, normalize=False, scale=1.0,
                              backend=backend)
        state.copy_(new.S.transpose(-1, -2))
        if D is not None:
            o = o + x * D.to(cd)
        if z is not None:
            o = o * F.silu(z.to(cd))
    return o if o.dtype == hidden_states.dtype else o.to(hidden_states.dtype)


def decode_plan(state: torch.Tensor, hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                z: torch.Tensor | None = None, *, backend: str = "auto") -> backends.Plan:
    """Whether `mamba2_selective_state_update` with these arguments (dt, A and dt_bias with one value per head:
    that function checks it first) runs as one compiled call: a `linattn.backends.Plan` with ``kernel="cpu"``, or
    None and ``why`` it runs the time step and the gates in torch around `linattn.step` instead."""
    return _plan(state, hidden_states, dt, A, B, C, D, dt_bias, z, backend)


def _plan(state, x, dt, A, B, C, D, dt_bias, z, backend) -> backends.Plan:
    shape = x.shape
    if type(state) is not torch.Tensor or state.dim() != 4 or state.shape[:3] != shape:
        return backends.Plan(None, "the state is not a tensor [B, H, P, N] for hidden_states [B, H, P]")
    N = state.shape[3]
    if (B.dim() != 3 or B.shape[0] != shape[0] or B.shape[2] != N or C.shape != B.shape or B.shape[1] == 0
            or shape[1] % B.shape[1]):
        return backends.Plan(None, "B and C are not [B, G, N] with G dividing the heads")
    if z is not None and z.shape != shape:
        return backends.Plan(None, "z is not [B, H, P]")
    if x.numel() == 0 or N == 0:
        return backends.Plan(None, "the step is empty")
    return backends.plan_ssm_step(backend, (x, dt, A, B, C, D, dt_bias, z), state)


_Tensor, _F32, _BF16 = torch.Tensor, torch.float32, torch.bfloat16
_KERNEL: list = []  # the compiled step's module once loaded (`linattn.backends.cpu.kernel`), or None


def _fast_step(state, x, dt, A, B, C, D, dt_bias, dt_softplus, z, backend):
    """The step in one compiled call (`linattn.kernels.cpu_ssm`) when the arguments prove the plain case with
    attribute reads alone, else None (nothing written; the full path decides, and `decode_plan` says why): CPU
    tensors outside autograd and torch.func, float32 or bfloat16 (no negative views), HF's shapes with dt, A and
    dt_bias expanded from one value per head (stride 0 along the expanded dims), D ``[H, P]`` or None, z as x or
    None, a float32 state ``[B, H, P, N]`` whose heads are contiguous ``[P, N]`` or ``[N, P]`` blocks, writable in
    place. A decode step at batch 1 is a few hundred microseconds with a cold cache, and there each Python line
    costs about a microsecond: hence one straight function, no torch op but the output's allocation."""
    kd = step_kernel(_KERNEL, "cpu_ssm", backend)
    if kd is None:
        return None
    if not (type(x) is _Tensor and type(dt) is _Tensor and type(A) is _Tensor and type(B) is _Tensor
            and type(C) is _Tensor and type(state) is _Tensor and state.dtype is _F32):
        return None
    shape, state_shape, B_shape = x.shape, state.shape, B.shape
    if len(shape) != 3 or len(state_shape) != 4 or len(B_shape) != 3 or dt.shape != shape:
        return None
    batch, H, P = shape
    N, G = state_shape[3], B_shape[1]
    if (state_shape[:3] != shape or A.shape != (H, P, N) or C.shape != B_shape or B_shape[0] != batch
            or B_shape[2] != N or batch * H * P * N == 0 or G == 0 or H % G):
        return None
    dts, As = dt.stride(), A.stride()
    if not ((dts[2] == 0 or P == 1) and (As[1] == 0 or P == 1) and (As[2] == 0 or N == 1)):
        return None  # not one value per head by the strides: the full path proves it by value, or goes to HF
    # the inputs with the kernel's IN_* bit of each (x 1, dt 2, A 4, dt_bias 8, D 16, z 32, B 64, C 128)
    given = ((x, 1), (dt, 2), (A, 4), (B, 64), (C, 128)) if D is None and dt_bias is None and z is None else tuple(
        (t, bit) for t, bit in ((x, 1), (dt, 2), (A, 4), (dt_bias, 8), (D, 16), (z, 32), (B, 64), (C, 128))
        if t is not None)
    dtypes = 0
    for t, bit in given:
        if type(t) is not _Tensor or not t.is_cpu or t.is_neg():
            return None
        dtype = t.dtype
        if dtype is _BF16:
            dtypes |= bit
        elif dtype is not _F32:
            return None
    if torch.is_grad_enabled() and (state.requires_grad or any(t.requires_grad for t, _ in given)):
        return None
    if not state.is_cpu or state.is_neg() or (state.is_inference() and not torch.is_inference_mode_enabled()):
        return None
    st = state.stride()
    if (st[3] == 1 or N == 1) and (st[2] == N or P == 1):
        layout = kd.LAYOUT_PN
    elif (st[2] == 1 or P == 1) and (st[3] == P or N == 1):
        layout = kd.LAYOUT_NP
    else:
        return None
    bias_at = sbias = D_at = sDh = sDp = z_at = szb = szh = szp = 0
    if dt_bias is not None:
        if dt_bias.shape != (H, P) or not (dt_bias.stride(1) == 0 or P == 1):
            return None
        bias_at, sbias = dt_bias.data_ptr(), dt_bias.stride(0)
    if D is not None:
        if D.shape != (H, P):
            return None
        D_at, (sDh, sDp) = D.data_ptr(), D.stride()
    if z is not None:
        if z.shape != shape:
            return None
        z_at, (szb, szh, szp) = z.data_ptr(), z.stride()
    y = torch.empty(shape, dtype=x.dtype)
    xs, Bs, Cs = x.stride(), B.stride(), C.stride()
    args = (x.data_ptr(), xs[0], xs[1], xs[2], dt.data_ptr(), dts[0], dts[1], A.data_ptr(), As[0], bias_at, sbias,
            D_at, 0, sDh, sDp, z_at, szb, szh, szp, B.data_ptr(), Bs[0], Bs[1], Bs[2], C.data_ptr(), Cs[0], Cs[1],
            Cs[2], state.data_ptr(), st[0], st[1], layout, y.data_ptr(), batch, H, G, P, N,
            1 if dt_softplus else 0, dtypes, 0, batch * H, -math.inf, math.inf)  # HF's decode does not clamp dt
    return _launch(kd, args, state, y)


def _launch(kd, args: tuple, state: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`linattn.kernels.cpu_ssm.step` on ``args`` (which update ``state`` and write ``y``), split over threads
    past the one-call decode kernel's measured threshold (`linattn.backends.policy.DECODE_SPLIT_MIN_ENTRIES`)."""
    entries = args[32] * args[33] * args[35] * args[36]  # B * H * P * N
    if entries >= policy.DECODE_SPLIT_MIN_ENTRIES and (threads := backends.decode_threads(entries)) > 1:
        kd.step_split(threads, args)
    else:
        kd.step(*args)
    increment_version(state)  # written through a raw pointer: a graph that saved the state must refuse it now
    return y


def compiled_step(kd, state, x, dt, A, B, C, D, dt_bias, z, dt_softplus,
                   dt_limit=(-math.inf, math.inf)) -> torch.Tensor:
    """The step in one compiled call (`linattn.kernels.cpu_ssm`), every input read where it lies (element
    strides; per-head values at their head strides), the state updated in place: y ``[B, H, P]`` in x's dtype.
    HF's decode step does not clamp dt (its chunk scan does): the adapter passes no ``dt_limit``."""
    batch, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    bf16 = torch.bfloat16
    dtypes = ((x.dtype == bf16) | (dt.dtype == bf16) << 1 | (A.dtype == bf16) << 2
              | (dt_bias is not None and dt_bias.dtype == bf16) << 3 | (D is not None and D.dtype == bf16) << 4
              | (z is not None and z.dtype == bf16) << 5 | (B.dtype == bf16) << 6 | (C.dtype == bf16) << 7)
    Dx = None if D is None else D.expand(x.shape)  # any shape that broadcasts, as strides (0 where it does)
    st = state.stride()
    layout = kd.LAYOUT_PN if (st[3] == 1 or N == 1) and (st[2] == N or P == 1) else kd.LAYOUT_NP
    y = torch.empty(x.shape, dtype=x.dtype)
    xs, dts, Bs, Cs = x.stride(), dt.stride(), B.stride(), C.stride()
    args = (x.data_ptr(), xs[0], xs[1], xs[2], dt.data_ptr(), dts[0], dts[1], A.data_ptr(), A.stride(0),
            0 if dt_bias is None else dt_bias.data_ptr(), 0 if dt_bias is None else dt_bias.stride(0),
            0 if Dx is None else Dx.data_ptr(), *((0, 0, 0) if Dx is None else Dx.stride()),
            0 if z is None else z.data_ptr(), *((0, 0, 0) if z is None else z.stride()),
            B.data_ptr(), Bs[0], Bs[1], Bs[2], C.data_ptr(), Cs[0], Cs[1], Cs[2],
            state.data_ptr(), st[0], st[1], layout, y.data_ptr(), batch, H, G, P, N, int(bool(dt_softplus)), dtypes,
            0, batch * H, float(dt_limit[0]), float(dt_limit[1]))
    return _launch(kd, args, state, y)


def mamba2_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                      initial_states=None, dt_limit=(0.0, float("inf")), return_final_states=False,
                                      *args, backend: str = "auto", fallback=None, **kwargs):
    """HF's fused training kernel: on linattn, None (as HF's own torch function returns), so that the layer runs
    its unfused path; off the CPU with ``backend="auto"``, the function HF chose."""
    if not on_linattn(backend, fallback, zxbcdt):
        return fallback(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, dt_limit,
                        return_final_states, *args, **kwargs)
    return None
