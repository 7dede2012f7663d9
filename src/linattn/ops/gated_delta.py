"""Gated delta rule, S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T (Gated DeltaNet), in every form.

Read as: decay the memory, predict v_t from it, write the error:
    S' = a_t S_{t-1};  u_t = b_t (v_t - S'^T k_t);  S_t = S' + k_t u_t^T;  o_t = S_t^T q_t.
``g`` is ``[B, H, T]`` (a = exp(g), one gate per head), ``[B, H, T, Dk]`` (one gate per key channel: Kimi Delta
Attention, S_t = (I - b_t k_t k_t^T) diag(a_t) S_{t-1} + b_t k_t v_t^T, the order of fla's ``naive_recurrent_kda``:
decay first, then predict and write, as for the per-head gate) or ``None``: then a = 1 and this is the plain delta
rule (``linattn.ops.delta`` reuses these kernels). ``beta`` (b) is ``[B, H, T]``. There is no normalizer z.
"""

from __future__ import annotations

import torch

from linattn.ops.common import carry_dtype, exp_in, gate_factors, log_cumsum, masked_exp_diff, to_chunks
from linattn.ops.gated import intra_per_channel


# ---------------------------------------------------------------------------------------------- recurrent
def recurrent(q, k, v, *, g=None, beta, initial_state, chunk_size=None, scale=1.0):
    """Token loop: the definition every other form must reproduce."""
    q = q * scale
    S = initial_state
    outputs = []
    for t in range(q.shape[2]):
        if g is not None:
            S = S * (g[:, :, t, :, None] if g.dim() == 4 else g[:, :, t, None, None]).exp()
        k_t = k[:, :, t]
        prediction = torch.einsum("bhk,bhkv->bhv", k_t, S)
        u = beta[:, :, t, None] * (v[:, :, t] - prediction)
        S = S + k_t[..., :, None] * u[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(outputs, dim=2), S


# ---------------------------------------------------------------------------------------------- step
def step(q, k, v, *, g=None, beta, state, inplace=False):
    """One token: q, k [B, H, Dk], v [B, H, Dv], g [B, H] or [B, H, Dk], beta [B, H], state [B, H, Dk, Dv]."""
    B, H, Dk = k.shape
    Dv = v.shape[-1]
    if g is not None:
        decay = g.exp()[..., None] if g.dim() == 3 else g.exp()[..., None, None]
        state = state.mul_(decay) if inplace else state * decay
    prediction = torch.matmul(k.unsqueeze(-2), state).squeeze(-2)
    u = beta[..., None] * (v - prediction)
    if inplace:
        state.view(B * H, Dk, Dv).baddbmm_(k.reshape(B * H, Dk, 1), u.reshape(B * H, 1, Dv))
        S = state
    else:
        S = state + k[..., :, None] * u[..., None, :]
    return torch.matmul(q.unsqueeze(-2), S).squeeze(-2), S


# ---------------------------------------------------------------------------------------------- chunk
def chunk(q, k, v, *, g=None, beta, initial_state, chunk_size=64, scale=1.0):
    """Chunkwise WY/UT form (Yang et al. 2024; Gated DeltaNet), batched over all chunks except one carry loop.

    Inside a chunk with cumulative log-gate G (0 before its first token) and incoming state S:
        A = strict_lower(diag(b) (K K^T) * exp(G_i - G_j))       corrections tokens make to later tokens
        [U | W] = (I + A)^{-1} [diag(b) V | diag(b) exp(G) K]     one unit-triangular solve for both
        U' = U - W S                                              the true writes, given S
        O = exp(G) Q S + [(Q K^T) * exp(G_i - G_j) * M] U'
        S <- exp(G_C) S + (exp(G_C - G) K)^T U'
    With a gate per key channel (KDA) every exp(G) above is a diagonal over the key channels: exp(G_i - G_j)
    sits inside the dot products (sum_c k_ic k_jc exp(G_ic - G_jc)) and exp(G_C) I becomes diag(exp(G_C)).
    Substituting U' makes each chunk an affine map of its incoming state, S <- M_c S + N_c with
    M_c = exp(G_C) I - K_out^T W and N_c = K_out^T U, so the loop over chunks is one small matmul each and the
    outputs are read afterwards in one batched matmul: O = (exp(G) Q - P W) S_c + P U.
    G comes from ``common.log_cumsum`` (gates floored, so finite): a reset g = -inf inside a chunk makes the
    decays across it exactly 0, never NaN. That matters beyond the reset's own row: P's masked zeros multiply
    every row of W in P W, so one NaN row after the reset would spoil the outputs before it too.
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    C = min(chunk_size, T)
    qc, kc, vc, bc = to_chunks(q, C), to_chunks(k, C), to_chunks(v, C), to_chunks(beta, C)  # padded b = 0
    N, n = qc.shape[:2]
    q2, k2, v2, b2 = qc.view(-1, C, Dk), kc.view(-1, C, Dk), vc.view(-1, C, Dv), bc.view(-1, C, 1)
    if g is None:
        A = torch.bmm(k2, k2.transpose(1, 2)).tril_(-1) * b2
        P = torch.bmm(q2, k2.transpose(1, 2)).tril_()
        q_in, k_in, k_out, decay = q2, k2, k2, None
    else:
        per_channel = g.dim() == 4
        Gc = log_cumsum(to_chunks(g, C), dim=2)  # float64: see common.log_cumsum
        Gc = Gc if per_channel else Gc[..., None]  # [N, n, C, Dk] per key channel, [N, n, C, 1] per head
        dt = q.dtype
        factors = gate_factors(Gc, dt)
        e_G = exp_in(Gc, dt) if factors is None else factors[0]
        q_in, k_in = (qc * e_G).view(-1, C, Dk), (kc * e_G).view(-1, C, Dk)
        if factors is not None:  # exp(G_i - G_j) = exp(G_i) exp(-G_j): the decay rides on q and k
            k_back = (kc * factors[1]).view(-1, C, Dk).transpose(1, 2)
            A = torch.bmm(k_in, k_back).tril_(-1) * b2
            P = torch.bmm(q_in, k_back).tril_()
        elif per_channel:  # the decay differs per channel: sub-blocks as in the gated rule (the solve ignores diag)
            A = intra_per_channel(kc, kc, Gc).view(-1, C, C) * b2
            P = intra_per_channel(qc, kc, Gc).view(-1, C, C)
        else:
            decay_ij = masked_exp_diff(Gc[..., 0], dt).view(-1, C, C)  # the solve below ignores its diagonal
            A = torch.bmm(k2, k2.transpose(1, 2)) * b2 * decay_ij
            P = torch.bmm(q2, k2.transpose(1, 2)) * decay_ij
        k_out = (kc * exp_in(Gc[:, :, -1:] - Gc, dt)).view(-1, C, Dk)
        decay = exp_in(Gc[:, :, -1], dt).reshape(-1, Gc.shape[-1], 1)  # [N*n, 1 or Dk, 1]: rows of diag(a)
    rhs = torch.cat([v2 * b2, k_in * b2], dim=-1)
    # A is strictly lower triangular: I + A is unit lower triangular, a triangular solve rather than an inverse.
    # (No half-precision triangular solve exists on every device: solve those in float32.)
    solve_dtype = torch.float32 if A.dtype in (torch.bfloat16, torch.float16) else A.dtype
    UW = torch.linalg.solve_triangular(A.to(solve_dtype), rhs.to(solve_dtype), upper=False, unitriangular=True)
    U, W = UW.to(A.dtype).split([Dv, Dk], dim=-1)
    k_out_t = k_out.transpose(1, 2)
    identity = torch.eye(Dk, dtype=A.dtype, device=A.device)
    M = (identity if decay is None else decay * identity) - torch.bmm(k_out_t, W)  # [N*n, Dk, Dk]
    Nw = torch.bmm(k_out_t, U)  # [N*n, Dk, Dv]
    # The running state is carried in float32 at least (see linattn.ops.common.ChunkCarry).
    acc = carry_dtype(q.dtype)
    M, Nw = M.view(N, n, Dk, Dk).to(acc), Nw.view(N, n, Dk, Dv).to(acc)
    states = [initial_state.reshape(N, Dk, Dv).to(acc)]
    # unbind, not M[:, c]: the backward of each index would write a zero tensor of M's whole size (n^2 traffic)
    for M_c, N_c in zip(M.unbind(1), Nw.unbind(1), strict=True):
        states.append(torch.baddbmm(N_c, M_c, states[-1]))
    S_before = torch.stack(states[:-1], dim=1).view(-1, Dk, Dv).to(q.dtype)
    o = torch.bmm(q_in - torch.bmm(P, W), S_before).baddbmm_(P, U, beta=scale, alpha=scale)
    return o.view(B, H, n * C, Dv)[:, :, :T], states[-1].view(B, H, Dk, Dv)


FORMS = {"recurrent": recurrent, "chunk": chunk}
