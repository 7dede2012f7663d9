"""Backward of accumulate and gated attention (per head or per key channel), as three runs of the Triton chunk
forward kernel.

For o_i = s [exp(G_i) q_i^T S0 + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) v_j] and the final state S_T (G the
cumulative log-gate from the sequence start, each gate floored as in the forward), with dO and dS_T given:

    dq_i = s [exp(G_i) S0 dO_i + sum_{j<=i} exp(G_i - G_j) (dO_i . v_j) k_j]
         = the forward with queries dO, keys v, values k, initial state S0^T, scale s;
    dv_j = sum_{i>=j} exp(G_i - G_j) (k_j . s q_i) dO_i + exp(G_T - G_j) dS_T^T k_j
         = the forward in reversed time with queries k, keys s q, values dO, initial state dS_T;
    dk_j = the forward in reversed time with queries v, keys dO, values s q, initial state dS_T^T;
    dS0  = exp(g_0) * (final state of the dv run)      (the reversed run's own gates stop short of g_0);
    dG_t = q_t . dq_t - k_t . dk_t (+ <S_T, dS_T> at t = T-1), dg = reverse cumulative sum of dG, 0 where a
           gate was floored (its true gradient is 0 there too, exp(g) being 0).

Reversed time: token r of the reversed run is token T-1-r, and the decay between reversed tokens must be the
product of the original gates strictly after the earlier original token, so the reversed gates are
g'_0 = 0, g'_r = g_{T-r}. The reversals are copies (torch.flip). Everything else is the forward kernel itself,
so the backward inherits its precision and its tests.

Per key channel the same holds channel by channel (exp(G_ic - G_jc) in every product); the dq and dk runs then
carry the decay on their output columns (``chunk_linear(..., value_gate=True)``), the dv run on its keys as the
forward does, and dG_tc = q_tc dq_tc - k_tc dk_tc (+ sum_v S_T dS_T at the last token) per channel.
"""

from __future__ import annotations

import torch

from linattn.kernels.triton._chunk import chunk_linear
from linattn.ops.common import LOG_GATE_FLOOR


def _flip(x):
    return None if x is None else x.flip(2)


def _reversed_gates(g):
    """g'_0 = 0, g'_r = g_{T-r}: [B, H, T] or [B, H, T, Dk]."""
    if g is None:
        return None
    return torch.cat([torch.zeros_like(g[:, :, :1]), g.flip(2)[:, :, :-1]], dim=2)


def chunk_linear_backward(q, k, v, g, s0, S_final, grad_o, grad_S, *, chunk_size, scale):
    """Gradients (dq, dk, dv, dg, dbeta=None, ds0) of ``_chunk.chunk_linear`` for g None, [B, H, T] or
    [B, H, T, Dk] (per key channel: the dq and dk runs then gate their output columns, ``value_gate``)."""
    acc = S_final.dtype
    per_channel = g is not None and g.dim() == q.dim()
    do = torch.zeros_like(v) if grad_o is None else grad_o.to(v.dtype)
    dS = torch.zeros_like(S_final) if grad_S is None else grad_S.to(acc)
    S0t = None if s0 is None else s0.transpose(-1, -2).to(acc)
    dq, _ = chunk_linear(do, v, k, g=g, initial_state=S0t, chunk_size=chunk_size, scale=scale, value_gate=per_channel)
    sq_r = _flip(q * scale)
    g_r = _reversed_gates(g)
    dv_r, dS0 = chunk_linear(_flip(k), sq_r, _flip(do), g=g_r, initial_state=dS, chunk_size=chunk_size, scale=1.0)
    dk_r, _ = chunk_linear(_flip(v), _flip(do), sq_r, g=g_r, initial_state=dS.transpose(-1, -2),
                           chunk_size=chunk_size, scale=1.0, value_gate=per_channel)
    dv, dk = dv_r.flip(2), dk_r.flip(2)
    dg = None
    if g is not None:
        a0 = g[:, :, 0].to(acc).clamp(min=LOG_GATE_FLOOR).exp()  # [B, H] or [B, H, Dk]
        dS0 = dS0 * (a0[..., None] if per_channel else a0[..., None, None])
        dG = q.to(acc) * dq.to(acc) - k.to(acc) * dk.to(acc)  # [B, H, T, Dk]
        last = S_final * dS  # [B, H, Dk, Dv]
        if per_channel:
            dG[:, :, -1] += last.sum(-1)
        else:
            dG = dG.sum(-1)
            dG[..., -1] += last.sum((-1, -2))
        dg = dG.flip(2).cumsum(2).flip(2)
        dg = torch.where(g >= LOG_GATE_FLOOR, dg, torch.zeros_like(dg)).to(g.dtype)
    ds0 = None if s0 is None else dS0.to(s0.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, None, ds0
