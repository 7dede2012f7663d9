"""Gated DeltaNet (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid): HF's ``torch_chunk_gated_delta_rule`` and
``torch_recurrent_gated_delta_rule`` on `linattn.linear_attention` (chunk form) and a `linattn.Decoder`,
with the same signatures and state layout ``[B, HV, Dk, Dv]``, so that HF's cache holds linattn's state unchanged."""

from __future__ import annotations

import math

import torch
from torch.autograd.graph import increment_version

import linattn
from linattn.backends import policy
from linattn.integrations.transformers.common import decoder, on_linattn, packed_boundaries, step_kernel
from linattn.state import State

_Tensor, _F32, _BF16, _CONTIGUOUS = torch.Tensor, torch.float32, torch.bfloat16, torch.contiguous_format
_KERNEL: list = []  # the one-call decode kernel's module once loaded (`linattn.backends.cpu.kernel`), or None
_PACKED = ("cu_seqlens", "cu_seq_lens_q", "seq_idx")  # the names HF passes packed boundaries by


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    fallback=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's/fla's ``chunk_gated_delta_rule`` signature on [`linattn.linear_attention`][linattn.linear_attention].

    query, key ``[B, T, H, Dk]``; value ``[B, T, HV, Dv]``; g, beta ``[B, T, HV]`` (g ``[B, T, HV, Dk]``: a gate
    per key channel, Kimi Delta Attention); initial_state ``[B, HV, Dk, Dv]`` (N entries with ``cu_seqlens``).
    Returns (output in query's dtype, final state or None). ``backend`` as in `linattn.linear_attention`;
    with ``"auto"``, tensors off the CPU go to ``fallback`` (the function HF chose) when one is given. Other
    keyword arguments HF passes along (position ids, masks) do not concern the rule and are ignored.
    """
    if not on_linattn(backend, fallback, query):
        return fallback(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        cu_seqlens=cu_seqlens, **kwargs)
    if cu_seqlens is None:  # Kimi's layers pass the boundaries under HF's own name
        cu_seqlens = packed_boundaries(kwargs, query.shape[1], query.shape[0], query.device)
    o, state = linattn.linear_attention(
        query, key, value, rule="gated_delta", g=g.to(torch.float32) if g.dtype != torch.float64 else g,
        beta=beta, feature_map="l2" if use_qk_l2norm_in_kernel else None, scale=scale,
        initial_state=None if initial_state is None else State(initial_state), output_final_state=output_final_state,
        chunk_size=chunk_size, cu_seqlens=cu_seqlens, backend=backend,
    )
    return o.to(query.dtype), None if state is None else state.S


def recurrent_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    fallback=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's ``torch_recurrent_gated_delta_rule`` signature: one token through linattn's decode step (longer inputs
    take the chunk form, the same function).

    With ``initial_state`` and ``output_final_state=True`` (HF's decode step with a cache), outside autograd and
    with the state in float32 (or float64 inputs), the step updates ``initial_state`` in place and returns it as
    the final state: HF's cache then copies it onto itself. The usual case (CPU, float32 or bfloat16 tokens, a
    contiguous float32 state) is one call of the compiled decode kernel on HF's own tensors, proven by attribute
    reads; the rest goes through a `linattn.Decoder` kept for that tensor. As HF's function, it computes in
    float32 and returns the output in query's dtype: bfloat16 tokens (a bfloat16 checkpoint) are widened inside
    the one-call kernel, with no float32 copies. Otherwise (autograd
    records, another state dtype, no state, or the final state not asked for) it runs
    [`linattn.step`][linattn.step] and leaves ``initial_state`` as it was, as HF's own function does."""
    if (backend == "auto" or backend == "cpu") and output_final_state is True and cu_seqlens is None:
        done = _fast_step(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel, scale, backend, kwargs)
        if done is not None:
            return done, initial_state
    if not on_linattn(backend, fallback, query):
        return fallback(query, key, value, g=g, beta=beta, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        cu_seqlens=cu_seqlens, **kwargs)
    if cu_seqlens is None:
        cu_seqlens = packed_boundaries(kwargs, query.shape[1], query.shape[0], query.device)
    if query.shape[1] != 1 or cu_seqlens is not None:
        return chunk_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                      scale=scale, backend=backend)
    feature_map = "l2" if use_qk_l2norm_in_kernel else None
    q, k, v, g, beta = query.select(1, 0), key.select(1, 0), value.select(1, 0), g.select(1, 0), beta.select(1, 0)
    if g.dtype not in (torch.float32, torch.float64, torch.bfloat16):  # (the decode kernel reads bfloat16 itself)
        g = g.to(torch.float32)
    dec = None
    if initial_state is not None and output_final_state:
        dec = decoder(initial_state, initial_state, (q, k, v, g, beta), "gated_delta", feature_map, scale, backend)
    if dec is not None:  # contiguous rows: the layout of the one-call kernel at batch > 1
        o = dec(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()).unsqueeze(1)
        return (o if o.dtype == query.dtype else o.to(query.dtype)), initial_state  # decode is all overhead: no op
    o, state = linattn.step(
        q, k, v, None if initial_state is None else State(initial_state), rule="gated_delta", g=g, beta=beta,
        feature_map=feature_map, scale=scale, state_dtype=torch.float32 if query.dtype != torch.float64 else None,
        backend=backend,
    )
    return o[:, None].to(query.dtype), state.S if output_final_state else None


def _fast_step(query, key, value, g, beta, S, l2, scale, backend, kwargs) -> torch.Tensor | None:
    """HF's decode step with a cache in one call of the one-call decode kernel (`linattn.kernels.cpu_decode`),
    proven the plain case by attribute reads alone, else None with nothing written (the path above decides, and
    names bad input): one token ``[B, 1, H, Dk]`` of CPU tensors, q, k, v float32 or bfloat16 (v in query's
    dtype), g ``[B, 1, HV]`` or ``[B, 1, HV, Dk]`` and beta ``[B, 1, HV]`` float32 or bfloat16, no negative
    views, outside autograd and torch.func, no packed boundaries; the state a contiguous float32 ``[B, HV, Dk,
    Dv]`` tensor writable in place, small enough for the serial kernel (the policy's split threshold). Inputs
    whose rows are not contiguous (batch > 1 of HF's split views) are copied once. Returns o ``[B, 1, HV, Dv]``
    in query's dtype after updating ``S`` in place. A decode step at batch 1 is a few hundred microseconds with
    a cold cache, where each Python line costs about a microsecond: hence one straight function, the same
    kernel call `linattn.decode.fast_decode` makes, no torch op but the output's allocation."""
    kd = step_kernel(_KERNEL, "cpu_decode", backend)
    if kd is None:
        return None
    if kwargs and any(kwargs.get(name) is not None for name in _PACKED):
        return None
    if not (type(query) is _Tensor and type(key) is _Tensor and type(value) is _Tensor and type(g) is _Tensor
            and type(beta) is _Tensor and type(S) is _Tensor and S.dtype is _F32 and S.is_contiguous()):
        return None
    q_shape, v_shape, S_shape = query.shape, value.shape, S.shape
    if len(q_shape) != 4 or len(v_shape) != 4 or len(S_shape) != 4 or key.shape != q_shape:
        return None
    B, T, H, D = q_shape
    HV, Dv = v_shape[2], v_shape[3]
    if (T != 1 or v_shape[0] != B or v_shape[1] != 1 or S_shape != (B, HV, D, Dv) or not (B and H and D and Dv)
            or HV % H or B * HV * D * Dv >= policy.DECODE_SPLIT_MIN_ENTRIES):
        return None
    g_shape = g.shape
    if g_shape == (B, 1, HV):
        width = 1
    elif g_shape == (B, 1, HV, D):
        width = D
    else:
        return None
    if beta.shape != (B, 1, HV) or not (scale is None or (type(scale) is float and math.isfinite(scale))):
        return None
    dtypes = 0  # the kernel's BF16_* bits (q 1, k 2, v 4, g 8, beta 16): the inputs it widens from bfloat16
    for t, bit in ((query, 1), (key, 2), (value, 4), (g, 8), (beta, 16)):
        if not t.is_cpu or t.is_neg():
            return None
        dtype = t.dtype
        if dtype is _BF16:
            dtypes |= bit
        elif dtype is not _F32:
            return None
    if value.dtype is not query.dtype or not S.is_cpu or S.is_neg():
        return None
    if torch.is_grad_enabled() and (S.requires_grad or query.requires_grad or key.requires_grad
                                    or value.requires_grad or g.requires_grad or beta.requires_grad):
        return None
    if S.is_inference() and not torch.is_inference_mode_enabled():
        return None
    # one token of [B, 1, H, D] contiguous is the kernel's [B, H, D] (HF's views at batch 1 are)
    q = query if query.is_contiguous() else query.contiguous()
    k = key if key.is_contiguous() else key.contiguous()
    v = value if value.is_contiguous() else value.contiguous()
    gc = g if g.is_contiguous() else g.contiguous()
    bc = beta if beta.is_contiguous() else beta.contiguous()
    # (empty_like: with the caches cold, measured 25-30 us against 65 us for torch.empty(shape, dtype=...))
    o = torch.empty_like(v, memory_format=_CONTIGUOUS)
    S_at = S.data_ptr()
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), gc.data_ptr(), bc.data_ptr(), S_at, S_at, o.data_ptr(),
            B, H, HV, D, Dv, width, kd.FEATURE_CODES["l2" if l2 else None], 0, 0, 1)
    status = (kd.decode_bf16(*args, dtypes, D**-0.5 if scale is None else scale, 1e-6) if dtypes
              else kd.decode(*args, D**-0.5 if scale is None else scale, 1e-6))
    if status != kd.OK:
        return None  # a bad gate: nothing was written; the path above raises the error that names it
    increment_version(S)  # written through a raw pointer: a graph that saved the state must refuse it now
    return o
