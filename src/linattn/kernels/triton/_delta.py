"""Chunk forward of the delta and gated delta rules (WY/UT form) in two Triton kernels.

With G the cumulative log-gate inside a chunk of BT tokens (0 for the plain delta rule; summed in float64 after
the floor, as ``linattn.ops.common.log_cumsum``), per chunk:

    A  = strict_lower(diag(beta) (k k^T) * exp(G_i - G_j))
    Ai = (I + A)^{-1}                             forward substitution, row by row, in registers
    W  = Ai (beta exp(G) k),  U = Ai (beta v)     (``_delta_wy``: every chunk at once, in parallel)
    U' = U - W S                                  the true writes given the incoming state S
    o  = scale * [ (q * exp(G)) S + (mask * (q k^T) * exp(G_i - G_j)) U' ]
    S <- exp(G_last) S + (k * exp(G_last - G))^T U'          (``_delta_fwd``: the chunks in order)

(the same algebra as ``linattn.ops.gated_delta.chunk``). The serial part of the solve therefore never sits in the
loop over chunks; W and U go through memory in float32 ([T, Dk + Dv] per head). The sequential kernel owns BV
value columns of one (batch, head) with the [Dk, BV] state in registers (float32; float64 for float64 inputs).
The solve and everything after it run in the accumulation dtype: the UT transform amplifies rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from linattn.kernels.triton._chunk import acc_dtype, unit_last
from linattn.kernels.triton._common import LOG_GATE_FLOOR, block_k, block_t, block_v
from linattn.kernels.triton._common import gates as _gates


@triton.jit
def _delta_wy(
    k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, ai_ptr,
    T, H, DK, DV,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sb_b, sb_h, sb_t,
    sw_b, sw_h, sw_t, su_b, su_h, su_t, sa_b, sa_h, sa_t,
    GATED: tl.constexpr, SAVE: tl.constexpr, FLOOR: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rt = tl.arange(0, BT)
    t = i_t * BT + rt
    mt = t < T
    mk = rk < DK
    causal = rt[:, None] >= rt[None, :]
    ACC = w_ptr.dtype.element_ty
    k = tl.load(k_ptr + i_b * sk_b + i_h * sk_h + t[:, None] * sk_t + rk[None, :], mask=mt[:, None] & mk[None, :],
                other=0.0).to(ACC)
    beta = tl.load(b_ptr + i_b * sb_b + i_h * sb_h + t * sb_t, mask=mt, other=0.0).to(ACC)  # padded: no write
    kk = tl.dot(k, tl.trans(k), input_precision="ieee")
    k_in = k
    if GATED:
        decay, e_G, _, _ = _gates(g_ptr + i_b * sg_b + i_h * sg_h, sg_t, t, mt, causal, ACC, FLOOR)
        kk = kk * decay
        k_in = k * e_G[:, None]
    A = tl.where(rt[:, None] > rt[None, :], kk * beta[:, None], 0.0)
    # (I + A)^{-1} by forward substitution: row i = e_i - sum_{j<i} A_ij row_j (rows j < i already final).
    eye = tl.where(rt[:, None] == rt[None, :], 1.0, 0.0).to(ACC)
    Ai = eye
    for i in range(1, BT):
        a_i = tl.sum(tl.where(rt[:, None] == i, A, 0.0), axis=0)  # row i of A
        row = tl.sum(a_i[:, None] * Ai, axis=0)
        Ai = tl.where(rt[:, None] == i, eye - row[None, :], Ai)
    if SAVE:  # (I + A)^{-1} of every chunk, for the backward (rows of padded tokens are not stored)
        tl.store(ai_ptr + i_b * sa_b + i_h * sa_h + t[:, None] * sa_t + rt[None, :], Ai, mask=mt[:, None])
    W = tl.dot(Ai, k_in * beta[:, None], input_precision="ieee")
    tl.store(w_ptr + i_b * sw_b + i_h * sw_h + t[:, None] * sw_t + rk[None, :], W, mask=mt[:, None] & mk[None, :])
    for i_v in range(0, tl.cdiv(DV, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        m_tv = mt[:, None] & (rv < DV)[None, :]
        v = tl.load(v_ptr + i_b * sv_b + i_h * sv_h + t[:, None] * sv_t + rv[None, :], mask=m_tv, other=0.0)
        U = tl.dot(Ai, v.to(ACC) * beta[:, None], input_precision="ieee")
        tl.store(u_ptr + i_b * su_b + i_h * su_h + t[:, None] * su_t + rv[None, :], U, mask=m_tv)


@triton.jit
def _delta_fwd(
    q_ptr, k_ptr, w_ptr, u_ptr, g_ptr, s0_ptr, o_ptr, sT_ptr, h_ptr, vn_ptr,
    T, H, DK, DV, scale,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sw_b, sw_h, sw_t, su_b, su_h, su_t, sg_b, sg_h, sg_t,
    s0_b, s0_h, s0_k, so_b, so_h, so_t, sT_b, sT_h, sT_k, sh_b, sh_h, sh_n, sh_k, svn_b, svn_h, svn_t,
    GATED: tl.constexpr, HAS_S0: tl.constexpr, SAVE: tl.constexpr, FLOOR: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    rt = tl.arange(0, BT)
    mk = rk < DK
    mv = rv < DV
    causal = rt[:, None] >= rt[None, :]
    ACC = sT_ptr.dtype.element_ty
    if HAS_S0:
        S = tl.load(s0_ptr + i_b * s0_b + i_h * s0_h + rk[:, None] * s0_k + rv[None, :],
                    mask=mk[:, None] & mv[None, :], other=0.0).to(ACC)
    else:
        S = tl.zeros([BK, BV], dtype=ACC)
    q_base = q_ptr + i_b * sq_b + i_h * sq_h
    k_base = k_ptr + i_b * sk_b + i_h * sk_h
    w_base = w_ptr + i_b * sw_b + i_h * sw_h
    u_base = u_ptr + i_b * su_b + i_h * su_h
    g_base = g_ptr + i_b * sg_b + i_h * sg_h
    o_base = o_ptr + i_b * so_b + i_h * so_h
    for i_t in range(0, tl.cdiv(T, BT)):
        t = i_t * BT + rt
        mt = t < T
        m_tk = mt[:, None] & mk[None, :]
        m_tv = mt[:, None] & mv[None, :]
        q = tl.load(q_base + t[:, None] * sq_t + rk[None, :], mask=m_tk, other=0.0).to(ACC)
        k = tl.load(k_base + t[:, None] * sk_t + rk[None, :], mask=m_tk, other=0.0).to(ACC)
        W = tl.load(w_base + t[:, None] * sw_t + rk[None, :], mask=m_tk, other=0.0)
        U = tl.load(u_base + t[:, None] * su_t + rv[None, :], mask=m_tv, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        if GATED:
            decay, e_G, e_out, e_last = _gates(g_base, sg_t, t, mt, causal, ACC, FLOOR)
            qk = qk * decay
            q_in = q * e_G[:, None]
            k_out = k * e_out[:, None]
            S_dec = S * e_last
        else:
            q_in = q
            k_out = k
            S_dec = S
        U = U - tl.dot(W, S, input_precision="ieee")
        if SAVE:  # for the backward: the state entering the chunk and the true writes U'
            tl.store(h_ptr + i_b * sh_b + i_h * sh_h + i_t * sh_n + rk[:, None] * sh_k + rv[None, :], S,
                     mask=mk[:, None] & mv[None, :])
            tl.store(vn_ptr + i_b * svn_b + i_h * svn_h + t[:, None] * svn_t + rv[None, :], U, mask=m_tv)
        o = tl.dot(q_in, S, input_precision="ieee") + tl.dot(tl.where(causal, qk, 0.0), U, input_precision="ieee")
        tl.store(o_base + t[:, None] * so_t + rv[None, :], (o * scale).to(o_ptr.dtype.element_ty), mask=m_tv)
        S = S_dec + tl.dot(tl.trans(k_out), U, input_precision="ieee")
    tl.store(sT_ptr + i_b * sT_b + i_h * sT_h + rk[:, None] * sT_k + rv[None, :], S, mask=mk[:, None] & mv[None, :])


def chunk_delta(q, k, v, *, g=None, beta, initial_state=None, chunk_size=64, scale=1.0, save=False):
    """Kernel contract of ``linattn.ops``: q, k [B, H, T, Dk], v [B, H, T, Dv], g None | [B, H, T], beta [B, H, T]
    (any strides) -> (o [B, H, T, Dv] in q's dtype, S [B, H, Dk, Dv] in float32, float64 for float64 inputs).

    ``chunk_size``: 16, 32 or 64 tokens (``_common.block_t``). ``save=True`` (autograd) also returns what the
    backward (``_delta_backward``) needs: (o, S, Saved(w, ai, h, vn, BT)).
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    q, k, v, g, beta = unit_last(q), unit_last(k), unit_last(v), unit_last(g), unit_last(beta)
    acc = acc_dtype(q.dtype)
    o = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)
    S = torch.empty(B, H, Dk, Dv, dtype=acc, device=q.device)
    w = torch.empty(B, H, T, Dk, dtype=acc, device=q.device)
    u = torch.empty(B, H, T, Dv, dtype=acc, device=q.device)
    BT, BK, BV = block_t(chunk_size), block_k(Dk), block_v(Dv)
    NT = triton.cdiv(T, BT)
    dev = q.device
    # Saved for the backward: (I + A)^{-1} [T, BT], the state entering each chunk [NT, Dk, Dv], U' [T, Dv].
    ai = torch.empty(B, H, T, BT, dtype=acc, device=dev) if save else S
    h = torch.empty(B, H, NT, Dk, Dv, dtype=acc, device=dev) if save else S
    vn = torch.empty(B, H, T, Dv, dtype=acc, device=dev) if save else S
    ai_s = ai.stride()[:3]
    h_s = h.stride()[:4] if save else (0, 0, 0, 0)
    vn_s = vn.stride()[:3]
    s0 = unit_last(initial_state) if initial_state is not None else S
    g_ = g if g is not None else beta
    warps = 8 if BK * BT >= 64 * 64 else 4  # many [BT, BT] and [BT, Dk] tiles live at once (not yet tuned)
    _delta_wy[(triton.cdiv(T, BT), B * H)](
        k, v, g_, beta, w, u, ai, T, H, Dk, Dv,
        *k.stride()[:3], *v.stride()[:3], *g_.stride()[:3], *beta.stride()[:3], *w.stride()[:3], *u.stride()[:3],
        *ai_s, GATED=g is not None, SAVE=save, FLOOR=LOG_GATE_FLOOR, BT=BT, BK=BK, BV=BV, num_warps=warps,
    )
    _delta_fwd[(triton.cdiv(Dv, BV), B * H)](
        q, k, w, u, g_, s0, o, S, h, vn, T, H, Dk, Dv, float(scale),
        *q.stride()[:3], *k.stride()[:3], *w.stride()[:3], *u.stride()[:3], *g_.stride()[:3],
        *s0.stride()[:3], *o.stride()[:3], *S.stride()[:3], *h_s, *vn_s,
        GATED=g is not None, HAS_S0=initial_state is not None, SAVE=save, FLOOR=LOG_GATE_FLOOR, BT=BT, BK=BK,
        BV=BV, num_warps=warps,
    )
    if save:
        return o, S, Saved(w, ai, h, vn, BT)
    return o, S


class Saved(NamedTuple):
    """What the delta forward keeps for its backward (accumulation dtype)."""

    w: torch.Tensor  # W = (I + A)^{-1} (beta exp(G) K), [B, H, T, Dk]
    ai: torch.Tensor  # (I + A)^{-1} per chunk, [B, H, T, BT]
    h: torch.Tensor  # the state entering each chunk, [B, H, NT, Dk, Dv]
    vn: torch.Tensor  # U' = U - W S, [B, H, T, Dv]
    BT: int
