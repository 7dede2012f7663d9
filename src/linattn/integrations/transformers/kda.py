"""Kimi Delta Attention (Kimi Linear, Bailing-hybrid): HF's ``chunk_kimi_delta_attention`` and
``recurrent_kimi_delta_attention`` are the gated delta rule with a gate per key channel, g ``[B, T, H, Dk]``:
S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (q_t / sqrt(Dk)), which
`linattn.linear_attention` takes as it is (rule ``"gated_delta"``, per-channel ``g``). Same signatures and
state layout ``[B, H, Dk, Dv]`` as HF's."""

from __future__ import annotations

import torch

from linattn.integrations.transformers.common import on_linattn
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
    """HF's ``recurrent_kimi_delta_attention``: one token through linattn's decode step, updating the cache's
    state in place outside autograd (as `recurrent_gated_delta_rule`)."""
    if (on_linattn(backend, fallback, query) and initial_state is not None and output_final_state
            and query.shape[1] == 1 and kwargs.get("cu_seqlens") is None and kwargs.get("cu_seq_lens_q") is None):
        o = _step_in_place(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel)
        if o is not None:
            return o, initial_state
    return recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend=backend,
                                      fallback=fallback, **kwargs)


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # linattn's "l2" map, fla's epsilon


def _step_in_place(query, key, value, g, beta, S, l2norm) -> torch.Tensor | None:
    """One token of the per-channel gated delta rule written into S ``[B, HV, Dk, Dv]`` where it lies, as four
    batched passes over S (scale the rows, read S^T k, add k u^T, read S^T q): linattn's compiled decode step
    does not take per-channel gates on a delta rule, and its torch step through the general path costs as much as
    HF's loop at one token. None (nothing written) where an in-place write is not what the caller gets: autograd
    records, S is not a contiguous CPU float32 tensor (float64 for float64 inputs), or inference tensors outside
    inference mode."""
    B, _, H, Dk = key.shape
    HV, Dv = value.shape[2], value.shape[3]
    cd = torch.float64 if query.dtype == torch.float64 else torch.float32
    if (S.dtype != cd or not S.is_contiguous() or S.device.type != "cpu" or S.shape != (B, HV, Dk, Dv)
            or g.shape != (B, 1, HV, Dk) or HV % H or (S.is_inference() and not torch.is_inference_mode_enabled())
            or (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, g, beta, S)))):
        return None
    if bool((g > 0).any()) or bool(g.isnan().any()):
        return None  # the general path names the bad gate
    q, k = query[:, 0].to(cd), key[:, 0].to(cd)
    if l2norm:
        q, k = _l2(q), _l2(k)
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=1), k.repeat_interleave(HV // H, dim=1)
    n = B * HV
    rows = S.view(n, Dk, Dv)
    S.mul_(g[:, 0].to(cd).exp().unsqueeze(-1))
    u = (value[:, 0].to(cd).reshape(n, 1, Dv) - torch.bmm(k.reshape(n, 1, Dk), rows)) * beta.to(cd).reshape(n, 1, 1)
    rows.baddbmm_(k.reshape(n, Dk, 1), u)
    o = torch.bmm((q * Dk**-0.5).reshape(n, 1, Dk), rows)
    return o.view(B, 1, HV, Dv).to(query.dtype)
