"""Kimi Delta Attention (Kimi Linear, Bailing-hybrid): HF's ``chunk_kimi_delta_attention`` and
``recurrent_kimi_delta_attention`` are the gated delta rule with a gate per key channel, g ``[B, T, H, Dk]``:
S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (q_t / sqrt(Dk)), which
`linattn.linear_attention` takes as it is (rule ``"gated_delta"``, per-channel ``g``). Same signatures and
state layout ``[B, H, Dk, Dv]`` as HF's."""

from __future__ import annotations

import torch

from linattn.integrations.transformers.gated_delta import chunk_gated_delta_rule, recurrent_gated_delta_rule


def chunk_kimi_delta_attention(query, key, value, g, beta, chunk_size: int = 64,
                               initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                               use_qk_l2norm_in_kernel: bool = False, *, backend: str = "auto", fallback=None,
                               **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's ``chunk_kimi_delta_attention``: query, key, value ``[B, T, H, D]``, g ``[B, T, H, Dk]``, beta
    ``[B, T, H]``, initial_state ``[B, H, Dk, Dv]`` (N entries for a packed call: ``cu_seqlens`` or HF's
    ``cu_seq_lens_q``). Returns (output in query's dtype, final state or None)."""
    return chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=chunk_size, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend=backend,
                                  fallback=fallback, **kwargs)


def recurrent_kimi_delta_attention(query, key, value, g, beta, initial_state: torch.Tensor | None = None,
                                   output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, *,
                                   backend: str = "auto", fallback=None,
                                   **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's ``recurrent_kimi_delta_attention``: one token through linattn's one-call decode step (per-channel
    gates included), updating the cache's state in place outside autograd, as `recurrent_gated_delta_rule`."""
    return recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend=backend,
                                      fallback=fallback, **kwargs)
