"""Gated delta rule, S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T (Gated DeltaNet), in every form.

Read as: decay the memory, predict v_t from it, write the error:
    S' = a_t S_{t-1};  u_t = b_t (v_t - S'^T k_t);  S_t = S' + k_t u_t^T;  o_t = S_t^T q_t.
``g`` is ``[B, H, T]`` (a = exp(g), one gate per head) or ``None``: then a = 1 and this is the plain delta rule
(``linattn.ops.delta`` reuses these kernels). ``beta`` (b) is ``[B, H, T]``. There is no normalizer z.
"""

from __future__ import annotations

import torch

from linattn.ops.gated import _exp, _log_cumsum, _masked_exp_diff, _to_chunks


# ---------------------------------------------------------------------------------------------- recurrent
def recurrent(q, k, v, *, g=None, beta, initial_state, chunk_size=None):
    """Token loop: the definition every other form must reproduce."""
    S = initial_state
    outputs = []
    for t in range(q.shape[2]):
        if g is not None:
            S = S * g[:, :, t, None, None].exp()
        k_t = k[:, :, t]
        prediction = torch.einsum("bhk,bhkv->bhv", k_t, S)
        u = beta[:, :, t, None] * (v[:, :, t] - prediction)
        S = S + k_t[..., :, None] * u[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(outputs, dim=2), S


# ---------------------------------------------------------------------------------------------- step
def step(q, k, v, *, g=None, beta, state, inplace=False):
    """One token: q, k [B, H, Dk], v [B, H, Dv], g and beta [B, H], state [B, H, Dk, Dv]."""
    B, H, Dk = k.shape
    Dv = v.shape[-1]
    if g is not None:
        state = state.mul_(g.exp()[..., None, None]) if inplace else state * g.exp()[..., None, None]
    prediction = torch.matmul(k.unsqueeze(-2), state).squeeze(-2)
    u = beta[..., None] * (v - prediction)
    if inplace:
        state.view(B * H, Dk, Dv).baddbmm_(k.reshape(B * H, Dk, 1), u.reshape(B * H, 1, Dv))
        S = state
    else:
        S = state + k[..., :, None] * u[..., None, :]
    return torch.matmul(q.unsqueeze(-2), S).squeeze(-2), S


# ---------------------------------------------------------------------------------------------- chunk
def chunk(q, k, v, *, g=None, beta, initial_state, chunk_size=64):
    """Chunkwise WY/UT form (Yang et al. 2024; Gated DeltaNet), batched over all chunks except one carry loop.

    Inside a chunk with cumulative log-gate G (0 before its first token) and incoming state S:
        A = strict_lower(diag(b) (K K^T) * exp(G_i - G_j))       corrections tokens make to later tokens
        [U | W] = (I + A)^{-1} [diag(b) V | diag(b) exp(G) K]     one unit-triangular solve for both
        U' = U - W S                                              the true writes, given S
        O = exp(G) Q S + [(Q K^T) * exp(G_i - G_j) * M] U'
        S <- exp(G_C) S + (exp(G_C - G) K)^T U'
    Substituting U' makes each chunk an affine map of its incoming state, S <- M_c S + N_c with
    M_c = exp(G_C) I - K_out^T W and N_c = K_out^T U, so the loop over chunks is one small matmul each and the
    outputs are read afterwards in one batched matmul: O = (exp(G) Q - P W) S_c + P U.
    """
    T = q.shape[2]
    C = min(chunk_size, T)
    qc, kc, vc, bc = _to_chunks(q, C), _to_chunks(k, C), _to_chunks(v, C), _to_chunks(beta, C)  # padded b = 0
    kk = torch.matmul(kc, kc.transpose(-1, -2))
    qk = torch.matmul(qc, kc.transpose(-1, -2))
    if g is None:
        A = bc[..., :, None] * kk.tril(-1)
        P = qk.tril()
        q_in, k_in, k_out = qc, kc, kc
        chunk_decay = None
    else:
        Gc = _log_cumsum(_to_chunks(g, C), dim=3)  # float64: see linattn.ops.gated._log_cumsum
        dt = q.dtype
        A = bc[..., :, None] * kk * _masked_exp_diff(Gc, dt, inclusive=False)
        P = qk * _masked_exp_diff(Gc, dt)
        q_in = qc * _exp(Gc, dt)[..., None]
        k_in = kc * _exp(Gc, dt)[..., None]
        k_out = kc * _exp(Gc[..., -1:] - Gc, dt)[..., None]
        chunk_decay = _exp(Gc[..., -1], dt)[..., None, None]  # [B, H, n, 1, 1]
    Dv = vc.shape[-1]
    rhs = torch.cat([bc[..., None] * vc, bc[..., None] * k_in], dim=-1)
    # A is strictly lower triangular: I + A is unit lower triangular, a triangular solve rather than an inverse.
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    if A.dtype in (torch.bfloat16, torch.float16):  # no half-precision triangular solve on every device
        UW = torch.linalg.solve_triangular(
            (A + eye).float(), rhs.float(), upper=False, unitriangular=True
        ).to(A.dtype)
    else:
        UW = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :Dv], UW[..., Dv:]
    k_out_t = k_out.transpose(-1, -2)
    identity = torch.eye(k_out_t.shape[-2], dtype=A.dtype, device=A.device)
    M = (identity if chunk_decay is None else chunk_decay * identity) - torch.matmul(k_out_t, W)  # [B, H, n, Dk, Dk]
    N = torch.matmul(k_out_t, U)
    states = [initial_state]
    for c in range(M.shape[2]):
        states.append(torch.baddbmm(N[:, :, c].flatten(0, 1), M[:, :, c].flatten(0, 1), states[-1].flatten(0, 1))
                      .view_as(states[-1]))
    S_before = torch.stack(states[:-1], dim=2)
    o = torch.matmul(q_in - torch.matmul(P, W), S_before) + torch.matmul(P, U)
    return o.flatten(2, 3)[:, :, :T], states[-1]


FORMS = {"recurrent": recurrent, "chunk": chunk}
