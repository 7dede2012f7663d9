"""Gated DeltaNet (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid): HF's ``torch_chunk_gated_delta_rule`` and
``torch_recurrent_gated_delta_rule`` on `linattn.linear_attention` (chunk form) and a `linattn.Decoder`,
with the same signatures and state layout ``[B, HV, Dk, Dv]``, so that HF's cache holds linattn's state unchanged."""

from __future__ import annotations

import torch

import linattn
from linattn.integrations.transformers.common import decoder, on_linattn, packed_boundaries
from linattn.state import State


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
    with the state in float32 (or float64 inputs), the step updates ``initial_state`` in place through a
    `linattn.Decoder` kept for that tensor, and returns it as the final state: HF's cache then copies it onto
    itself. As HF's function, it computes in float32 and returns the output in query's dtype: bfloat16 tokens
    (a bfloat16 checkpoint) are widened inside the one-call kernel, with no float32 copies. Otherwise (autograd
    records, another state dtype, no state, or the final state not asked for) it runs
    [`linattn.step`][linattn.step] and leaves ``initial_state`` as it was, as HF's own function does."""
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
