"""Backward of the delta and gated delta rules (WY/UT form) in two Triton kernels.

The forward (``_delta.chunk_delta(..., save=True)``) keeps, in the accumulation dtype, W = Ai (b exp(G) K) and
Ai = (I + A)^{-1} of every chunk, the state S_c entering each chunk and the true writes U' = U - W S_c. Per chunk
(G the cumulative log-gate inside it, D_ij = exp(G_i - G_j) for j <= i, P = mask * (Q K^T) * D, s the scale):

    o  = s [exp(G) Q S_c + P U'],    S_{c+1} = exp(G_last) S_c + K_out^T U',   K_out = exp(G_last - G) K

1. ``_delta_bwd_dh``, the chunks in reversed order (one program per value block of one head, dS in registers):
       dU' = s P^T dO + K_out dS_{c+1}
       dS_c = exp(G_last) dS_{c+1} + s (exp(G) Q)^T dO - W^T dU'
   it stores dU' and dS_{c+1} of every chunk, and dS_0 (the initial state's gradient).
2. ``_delta_bwd_chunk``, every chunk at once (one program per chunk of one head, the value blocks in a loop):
       dQ = s [exp(G) dO S_c^T + (mask * dP * D) K],  dP = dO U'^T
       dK = s (mask * dP * D)^T Q + K_out-part (exp(G_last - G) * U' dS_{c+1}^T) + the WY parts below
       dW = -dU' S_c^T;   U = Ai (b V), so dV = b (Ai^T dU'), db += rowsum((Ai^T dU') * V)
       W = Ai (b exp(G) K): X = Ai^T dW, dK += b exp(G) X, db += exp(G) rowsum(X * K)
       dAi = dW (b exp(G) K)^T + dU' (b V)^T;  dA = -Ai^T dAi Ai^T (strictly lower)
       A_ij = b_i (K_i . K_j) D_ij:  db_i += sum_j dA_ij (K K^T D)_ij,  dK += (dA b D) K + (dA b D)^T K
   and the gate: every G_i appears in the products above; dG_i collects the derivative of each (a term
   c exp(G_i - G_j) adds c exp(..) to dG_i and takes it from dG_j), exp(G_last) adds <exp(G_last) S_c, dS_{c+1}>
   to the last position, and dg_t = sum_{i >= t in the chunk} dG_i (G is a cumulative sum of g). Padded
   positions carry g = 0, so G_last is the G of the chunk's last position, padded or not.

Everything runs in the accumulation dtype (float32; float64 for float64 inputs), as the forward's solve does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linattn.kernels.triton._chunk import unit_last
from linattn.kernels.triton._common import LOG_GATE_FLOOR, block_k, block_v
from linattn.kernels.triton._common import gates as _gates
from linattn.kernels.triton._delta import Saved


@triton.jit
def _delta_bwd_dh(
    q_ptr, k_ptr, w_ptr, g_ptr, do_ptr, dST_ptr, dvn_ptr, dh_ptr, ds0_ptr,
    T, H, DK, DV, scale,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sw_b, sw_h, sw_t, sg_b, sg_h, sg_t, sdo_b, sdo_h, sdo_t,
    sdT_b, sdT_h, sdT_k, sdv_b, sdv_h, sdv_t, sdh_b, sdh_h, sdh_n, sdh_k, sd0_b, sd0_h, sd0_k,
    GATED: tl.constexpr, HAS_DST: tl.constexpr, FLOOR: tl.constexpr,
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
    m_kv = mk[:, None] & mv[None, :]
    causal = rt[:, None] >= rt[None, :]
    ACC = dh_ptr.dtype.element_ty
    if HAS_DST:
        dS = tl.load(dST_ptr + i_b * sdT_b + i_h * sdT_h + rk[:, None] * sdT_k + rv[None, :], mask=m_kv,
                     other=0.0).to(ACC)
    else:
        dS = tl.zeros([BK, BV], dtype=ACC)
    q_base = q_ptr + i_b * sq_b + i_h * sq_h
    k_base = k_ptr + i_b * sk_b + i_h * sk_h
    w_base = w_ptr + i_b * sw_b + i_h * sw_h
    g_base = g_ptr + i_b * sg_b + i_h * sg_h
    do_base = do_ptr + i_b * sdo_b + i_h * sdo_h
    NT = tl.cdiv(T, BT)
    for j in range(0, NT):
        i_t = NT - 1 - j
        t = i_t * BT + rt
        mt = t < T
        m_tk = mt[:, None] & mk[None, :]
        m_tv = mt[:, None] & mv[None, :]
        tl.store(dh_ptr + i_b * sdh_b + i_h * sdh_h + i_t * sdh_n + rk[:, None] * sdh_k + rv[None, :], dS, mask=m_kv)
        q = tl.load(q_base + t[:, None] * sq_t + rk[None, :], mask=m_tk, other=0.0).to(ACC)
        k = tl.load(k_base + t[:, None] * sk_t + rk[None, :], mask=m_tk, other=0.0).to(ACC)
        W = tl.load(w_base + t[:, None] * sw_t + rk[None, :], mask=m_tk, other=0.0)
        do = tl.load(do_base + t[:, None] * sdo_t + rv[None, :], mask=m_tv, other=0.0).to(ACC)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        if GATED:
            decay, e_G, e_out, e_last = _gates(g_base, sg_t, t, mt, causal, ACC, FLOOR)
            qk = qk * decay
            q_in = q * e_G[:, None]
            k_out = k * e_out[:, None]
        else:
            q_in = q
            k_out = k
        P = tl.where(causal, qk, 0.0) * scale
        dU = tl.dot(tl.trans(P), do, input_precision="ieee") + tl.dot(k_out, dS, input_precision="ieee")
        tl.store(dvn_ptr + i_b * sdv_b + i_h * sdv_h + t[:, None] * sdv_t + rv[None, :], dU, mask=m_tv)
        dS_in = tl.dot(tl.trans(q_in), do, input_precision="ieee") * scale
        dS_in -= tl.dot(tl.trans(W), dU, input_precision="ieee")
        if GATED:
            dS = dS * e_last + dS_in
        else:
            dS = dS + dS_in
    tl.store(ds0_ptr + i_b * sd0_b + i_h * sd0_h + rk[:, None] * sd0_k + rv[None, :], dS, mask=m_kv)


@triton.jit
def _delta_bwd_chunk(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, ai_ptr, h_ptr, dh_ptr, vn_ptr, dvn_ptr, do_ptr,
    dq_ptr, dk_ptr, dv_ptr, dg_ptr, db_ptr,
    T, H, DK, DV, scale,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sb_b, sb_h, sb_t,
    sa_b, sa_h, sa_t, sh_b, sh_h, sh_n, sh_k, sdh_b, sdh_h, sdh_n, sdh_k, svn_b, svn_h, svn_t,
    sdv_b, sdv_h, sdv_t, sdo_b, sdo_h, sdo_t,
    sgq_b, sgq_h, sgq_t, sgk_b, sgk_h, sgk_t, sgv_b, sgv_h, sgv_t, sgg_b, sgg_h, sgg_t, sgb_b, sgb_h, sgb_t,
    GATED: tl.constexpr, FLOOR: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
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
    m_tk = mt[:, None] & mk[None, :]
    causal = rt[:, None] >= rt[None, :]
    strict = rt[:, None] > rt[None, :]
    ACC = dh_ptr.dtype.element_ty
    q = tl.load(q_ptr + i_b * sq_b + i_h * sq_h + t[:, None] * sq_t + rk[None, :], mask=m_tk, other=0.0).to(ACC)
    k = tl.load(k_ptr + i_b * sk_b + i_h * sk_h + t[:, None] * sk_t + rk[None, :], mask=m_tk, other=0.0).to(ACC)
    beta = tl.load(b_ptr + i_b * sb_b + i_h * sb_h + t * sb_t, mask=mt, other=0.0).to(ACC)
    # Rows of padded tokens were not stored: load them as 0 (they only ever multiply zero gradients).
    Ai = tl.load(ai_ptr + i_b * sa_b + i_h * sa_h + t[:, None] * sa_t + rt[None, :], mask=mt[:, None], other=0.0)
    if GATED:
        decay, e_G, e_out, e_last = _gates(g_ptr + i_b * sg_b + i_h * sg_h, sg_t, t, mt, causal, ACC, FLOOR)
    h_base = h_ptr + i_b * sh_b + i_h * sh_h + i_t * sh_n
    dh_base = dh_ptr + i_b * sdh_b + i_h * sdh_h + i_t * sdh_n
    dq = tl.zeros([BT, BK], dtype=ACC)  # dO S_c^T
    dk_state = tl.zeros([BT, BK], dtype=ACC)  # U' dS_{c+1}^T
    dW = tl.zeros([BT, BK], dtype=ACC)
    dP = tl.zeros([BT, BT], dtype=ACC)  # dO U'^T
    dAi = tl.zeros([BT, BT], dtype=ACC)
    db = tl.zeros([BT], dtype=ACC)
    state_dot = tl.zeros([BK], dtype=ACC)  # <S_c, dS_{c+1}> (summed to a scalar below)
    for i_v in range(0, tl.cdiv(DV, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        mv = rv < DV
        m_tv = mt[:, None] & mv[None, :]
        m_kv = mk[:, None] & mv[None, :]
        S = tl.load(h_base + rk[:, None] * sh_k + rv[None, :], mask=m_kv, other=0.0)
        dS = tl.load(dh_base + rk[:, None] * sdh_k + rv[None, :], mask=m_kv, other=0.0)
        vn = tl.load(vn_ptr + i_b * svn_b + i_h * svn_h + t[:, None] * svn_t + rv[None, :], mask=m_tv, other=0.0)
        dvn = tl.load(dvn_ptr + i_b * sdv_b + i_h * sdv_h + t[:, None] * sdv_t + rv[None, :], mask=m_tv, other=0.0)
        do = tl.load(do_ptr + i_b * sdo_b + i_h * sdo_h + t[:, None] * sdo_t + rv[None, :], mask=m_tv,
                     other=0.0).to(ACC)
        v = tl.load(v_ptr + i_b * sv_b + i_h * sv_h + t[:, None] * sv_t + rv[None, :], mask=m_tv, other=0.0).to(ACC)
        dq += tl.dot(do, tl.trans(S), input_precision="ieee")
        dP += tl.dot(do, tl.trans(vn), input_precision="ieee")
        dk_state += tl.dot(vn, tl.trans(dS), input_precision="ieee")
        dW -= tl.dot(dvn, tl.trans(S), input_precision="ieee")
        dAi += tl.dot(dvn, tl.trans(v * beta[:, None]), input_precision="ieee")
        Y = tl.dot(tl.trans(Ai), dvn, input_precision="ieee")  # the gradient of U = Ai (b V)
        tl.store(dv_ptr + i_b * sgv_b + i_h * sgv_h + t[:, None] * sgv_t + rv[None, :],
                 (Y * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=m_tv)
        db += tl.sum(Y * v, axis=1)
        state_dot += tl.sum(S * dS, axis=1)
    qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    kk = tl.dot(k, tl.trans(k), input_precision="ieee")
    if GATED:
        qk = qk * decay
        kk = kk * decay
        dq = dq * e_G[:, None]
        dk_state = dk_state * e_out[:, None]
        k_w = k * e_G[:, None]  # W's right-hand side without beta
        b_w = beta * e_G
    else:
        k_w = k
        b_w = beta
    dq = dq * scale  # the read of the incoming state, s exp(G) dO S_c^T
    dqk = tl.where(causal, dP, 0.0) * scale  # d/d(Q K^T D) of the intra-chunk output
    if GATED:
        dqk = dqk * decay
    dq_intra = tl.dot(dqk, k, input_precision="ieee")
    dk = tl.dot(tl.trans(dqk), q, input_precision="ieee") + dk_state
    # W = Ai (b exp(G) K)
    dAi += tl.dot(dW, tl.trans(k_w * beta[:, None]), input_precision="ieee")
    X = tl.dot(tl.trans(Ai), dW, input_precision="ieee")
    xk = tl.sum(X * k_w, axis=1)
    dk += X * b_w[:, None]
    db += xk
    # Ai = (I + A)^{-1}: dA = -Ai^T dAi Ai^T, strictly lower; A_ij = b_i (K_i . K_j) D_ij
    dA = -tl.dot(tl.trans(Ai), tl.dot(dAi, tl.trans(Ai), input_precision="ieee"), input_precision="ieee")
    dA = tl.where(strict, dA, 0.0)
    db += tl.sum(dA * kk, axis=1)
    dAb = dA * beta[:, None]
    if GATED:
        dAb = dAb * decay
    dk += tl.dot(dAb, k, input_precision="ieee") + tl.dot(tl.trans(dAb), k, input_precision="ieee")
    dq_all = dq + dq_intra
    m_tk2 = mt[:, None] & mk[None, :]
    tl.store(dq_ptr + i_b * sgq_b + i_h * sgq_h + t[:, None] * sgq_t + rk[None, :],
             dq_all.to(dq_ptr.dtype.element_ty), mask=m_tk2)
    tl.store(dk_ptr + i_b * sgk_b + i_h * sgk_h + t[:, None] * sgk_t + rk[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=m_tk2)
    tl.store(db_ptr + i_b * sgb_b + i_h * sgb_h + t * sgb_t, db.to(db_ptr.dtype.element_ty), mask=mt)
    if GATED:
        # dG_i: the inter-chunk read (q . dq_inter), the intra products (rows minus columns), the state write
        # (K_out: minus at j, plus at the last position), W's exp(G) and A's decays (rows minus columns).
        M = tl.where(causal, dP * qk, 0.0) * scale  # s dP_ij (QK)_ij D_ij
        MA = dA * beta[:, None] * kk  # dA_ij A_ij
        Z = tl.sum(k * dk_state, axis=1)
        dG = tl.sum(q * dq, axis=1) + tl.sum(M, axis=1) - tl.sum(M, axis=0) - Z + beta * xk
        dG += tl.sum(MA, axis=1) - tl.sum(MA, axis=0)
        last = tl.sum(Z, axis=0) + e_last * tl.sum(state_dot, axis=0)
        dG = tl.where(rt == BT - 1, dG + last, dG)
        # g is summed into G: dg_t = sum_{i >= t} dG_i inside the chunk
        dg = tl.sum(tl.where(rt[None, :] >= rt[:, None], dG[None, :], 0.0), axis=1)
        tl.store(dg_ptr + i_b * sgg_b + i_h * sgg_h + t * sgg_t, dg.to(dg_ptr.dtype.element_ty), mask=mt)


def chunk_delta_backward(q, k, v, g, beta, s0, saved: Saved, grad_o, grad_S, *, scale):
    """Gradients (dq, dk, dv, dg, dbeta, ds0) of ``_delta.chunk_delta`` from what its ``save=True`` forward kept.

    ``g`` None or [B, H, T] (one gate per head); ``grad_o``/``grad_S`` may be None (that output unused)."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    acc = saved.h.dtype
    dev = q.device
    BT, BK, BV = saved.BT, block_k(Dk), block_v(Dv)
    NT = triton.cdiv(T, BT)
    q, k, v, g, beta = unit_last(q), unit_last(k), unit_last(v), unit_last(g), unit_last(beta)
    do = torch.zeros(B, H, T, Dv, dtype=acc, device=dev) if grad_o is None else unit_last(grad_o)
    dST = None if grad_S is None else unit_last(grad_S.to(acc))
    dvn = torch.empty(B, H, T, Dv, dtype=acc, device=dev)
    dh = torch.empty(B, H, NT, Dk, Dv, dtype=acc, device=dev)
    ds0 = torch.empty(B, H, Dk, Dv, dtype=acc, device=dev)
    g_ = g if g is not None else beta
    dT_ = dST if dST is not None else ds0
    warps = 8 if BK * BT >= 64 * 64 else 4  # as the forward (not yet tuned)
    _delta_bwd_dh[(triton.cdiv(Dv, BV), B * H)](
        q, k, saved.w, g_, do, dT_, dvn, dh, ds0, T, H, Dk, Dv, float(scale),
        *q.stride()[:3], *k.stride()[:3], *saved.w.stride()[:3], *g_.stride()[:3], *do.stride()[:3],
        *dT_.stride()[:3], *dvn.stride()[:3], *dh.stride()[:4], *ds0.stride()[:3],
        GATED=g is not None, HAS_DST=dST is not None, FLOOR=LOG_GATE_FLOOR, BT=BT, BK=BK, BV=BV, num_warps=warps,
    )
    dq = torch.empty(B, H, T, Dk, dtype=q.dtype, device=dev)
    dk = torch.empty(B, H, T, Dk, dtype=k.dtype, device=dev)
    dv = torch.empty(B, H, T, Dv, dtype=v.dtype, device=dev)
    db = torch.empty(B, H, T, dtype=beta.dtype, device=dev)
    dg = torch.empty(B, H, T, dtype=g.dtype, device=dev) if g is not None else db
    _delta_bwd_chunk[(NT, B * H)](
        q, k, v, g_, beta, saved.ai, saved.h, dh, saved.vn, dvn, do, dq, dk, dv, dg, db, T, H, Dk, Dv, float(scale),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g_.stride()[:3], *beta.stride()[:3],
        *saved.ai.stride()[:3], *saved.h.stride()[:4], *dh.stride()[:4], *saved.vn.stride()[:3],
        *dvn.stride()[:3], *do.stride()[:3],
        *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], *dg.stride()[:3], *db.stride()[:3],
        GATED=g is not None, FLOOR=LOG_GATE_FLOOR, BT=BT, BK=BK, BV=BV, num_warps=warps,
    )
    if g is not None:  # a floored gate's gradient is 0 (its exp is 0 either way)
        dg = torch.where(g >= LOG_GATE_FLOOR, dg, torch.zeros_like(dg))
    else:
        dg = None
    return dq, dk, dv, dg, db, None if s0 is None else ds0.to(s0.dtype)
