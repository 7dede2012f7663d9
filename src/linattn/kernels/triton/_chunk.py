"""Chunk forward of accumulate and gated attention (per head and per key channel) in one Triton kernel.

One program owns BV value columns of one (batch, head) sequence and walks its chunks in order, keeping the
[Dk, BV] state in registers in the accumulation dtype (float32; float64 for float64 inputs). Per chunk of BT
tokens, with G the cumulative log-gate inside the chunk (summed in float64 after flooring each gate at
``LOG_GATE_FLOOR``, exactly as ``linattn.ops.common.log_cumsum``):

    o = scale * [ (q * exp(G)) S + (mask * (q k^T) * exp(G_i - G_j)) v ]
    S <- exp(G_last) S + (k * exp(G_last - G))^T v

Every exponent is <= 0 (the causal mask is applied before the exp), so nothing overflows whatever the gates.
Per key channel the decayed scores are not one matmul: the chunk is then 16 tokens and the exact [BT, BT, Dk]
decay is formed in registers. Matmul operands are in the input dtype (bfloat16/float16 use the tensor cores),
every product accumulates in float32 or wider, float32 operands are multiplied in IEEE float32 (no TF32).
Launch: 4 warps, 8 for a key block of 128 or more (a guess, not yet tuned on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linattn.kernels.triton._common import (
    GATE_CHANNEL,
    GATE_VALUE,
    LOG_GATE_FLOOR,
    block_k,
    block_t,
    block_v,
    gate_kind,
)


@triton.jit
def _chunk_linear_fwd(
    q_ptr, k_ptr, v_ptr, g_ptr, s0_ptr, o_ptr, sT_ptr,
    T, H, DK, DV, scale,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t,
    s0_b, s0_h, s0_k, so_b, so_h, so_t, sT_b, sT_h, sT_k,
    GATE: tl.constexpr, HAS_S0: tl.constexpr, FLOOR: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
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
    v_base = v_ptr + i_b * sv_b + i_h * sv_h
    g_base = g_ptr + i_b * sg_b + i_h * sg_h
    o_base = o_ptr + i_b * so_b + i_h * so_h
    for i_t in range(0, tl.cdiv(T, BT)):
        t = i_t * BT + rt
        mt = t < T
        m_tk = mt[:, None] & mk[None, :]
        q = tl.load(q_base + t[:, None] * sq_t + rk[None, :], mask=m_tk, other=0.0).to(DT)
        k = tl.load(k_base + t[:, None] * sk_t + rk[None, :], mask=m_tk, other=0.0).to(DT)
        v = tl.load(v_base + t[:, None] * sv_t + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(DT)
        if GATE == 3:
            # One gate per value column (the backward's dq and dk runs): the decay multiplies output columns.
            m_tv = mt[:, None] & mv[None, :]
            g = tl.load(g_base + t[:, None] * sg_t + rv[None, :], mask=m_tv, other=0.0).to(tl.float64)
            g = tl.maximum(g, FLOOR)
            G = tl.cumsum(g, axis=0)  # [BT, BV]
            G_last = tl.sum(g, axis=0)  # [BV]
            G_hi = G.to(ACC)
            G_lo = (G - G_hi.to(tl.float64)).to(ACC)
            diff = (G_hi[:, None, :] - G_hi[None, :, :]) + (G_lo[:, None, :] - G_lo[None, :, :])  # [BT, BT, BV]
            decay = tl.exp(tl.where(causal[:, :, None], diff, float("-inf")))
            P = tl.where(causal, tl.dot(q, tl.trans(k), input_precision=PREC, out_dtype=ACC), 0.0)
            o = tl.dot(q, S.to(DT), input_precision=PREC, out_dtype=ACC) * tl.exp(G_hi)
            o += tl.sum(P[:, :, None] * v.to(ACC)[None, :, :] * decay, axis=1)
            tl.store(o_base + t[:, None] * so_t + rv[None, :], (o * scale).to(o_ptr.dtype.element_ty), mask=m_tv)
            v_out = (v.to(ACC) * tl.exp((G_last[None, :] - G).to(ACC))).to(DT)
            S = S * tl.exp(G_last.to(ACC))[None, :] + tl.dot(tl.trans(k), v_out, input_precision=PREC, out_dtype=ACC)
        else:
            if GATE == 0:
                A = tl.dot(q, tl.trans(k), input_precision=PREC, out_dtype=ACC)
                A = tl.where(causal, A, 0.0)
                q_in = q
                k_out = k
                S_next = S
            elif GATE == 1:
                # Padded tokens get log-gate 0 (a = 1): they leave the state unchanged.
                g = tl.load(g_base + t * sg_t, mask=mt, other=0.0).to(tl.float64)
                g = tl.maximum(g, FLOOR)
                G = tl.cumsum(g, axis=0)
                G_last = tl.sum(g, axis=0)
                decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")).to(ACC))
                A = tl.dot(q, tl.trans(k), input_precision=PREC, out_dtype=ACC) * decay
                q_in = (q.to(ACC) * tl.exp(G.to(ACC))[:, None]).to(DT)
                k_out = (k.to(ACC) * tl.exp((G_last - G).to(ACC))[:, None]).to(DT)
                S_next = S * tl.exp(G_last.to(ACC))
            elif GATE == 2:
                g = tl.load(g_base + t[:, None] * sg_t + rk[None, :], mask=m_tk, other=0.0).to(tl.float64)
                g = tl.maximum(g, FLOOR)
                G = tl.cumsum(g, axis=0)  # [BT, BK]
                G_last = tl.sum(g, axis=0)  # [BK]
                # G_i - G_j from float64 G without a float64 [BT, BT, BK] tensor: G = hi + lo in two floats. hi_i - hi_j
                # is exact when the two are close (Sterbenz) and rounds like the true difference when they are not.
                G_hi = G.to(ACC)
                G_lo = (G - G_hi.to(tl.float64)).to(ACC)
                diff = (G_hi[:, None, :] - G_hi[None, :, :]) + (G_lo[:, None, :] - G_lo[None, :, :])  # [BT, BT, BK]
                decay = tl.exp(tl.where(causal[:, :, None], diff, float("-inf")))
                A = tl.sum(q.to(ACC)[:, None, :] * k.to(ACC)[None, :, :] * decay, axis=2)
                q_in = (q.to(ACC) * tl.exp(G.to(ACC))).to(DT)
                k_out = (k.to(ACC) * tl.exp((G_last[None, :] - G).to(ACC))).to(DT)
                S_next = S * tl.exp(G_last.to(ACC))[:, None]
            o = tl.dot(q_in, S.to(DT), input_precision=PREC, out_dtype=ACC)
            o += tl.dot(A.to(DT), v, input_precision=PREC, out_dtype=ACC)
            tl.store(o_base + t[:, None] * so_t + rv[None, :], (o * scale).to(o_ptr.dtype.element_ty),
                     mask=mt[:, None] & mv[None, :])
            S = S_next + tl.dot(tl.trans(k_out), v, input_precision=PREC, out_dtype=ACC)
    tl.store(sT_ptr + i_b * sT_b + i_h * sT_h + rk[:, None] * sT_k + rv[None, :], S, mask=mk[:, None] & mv[None, :])


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32, torch.float64: tl.float64}


def dot_dtype(dtype: torch.dtype, kernel) -> tl.dtype:
    """Dtype of the matmul operands: the input dtype, except bfloat16 under Triton's interpreter, whose tl.dot
    reads bfloat16 operands wrongly (Triton 3.9); there the operands are widened to float32, which computes the
    same products (bfloat16 products are exact in float32) up to the order of the float32 sums."""
    from triton.runtime.interpreter import InterpretedFunction

    if dtype == torch.bfloat16 and isinstance(kernel, InterpretedFunction):
        return tl.float32
    return _TL[dtype]


def unit_last(x):
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def chunk_linear(q, k, v, *, g=None, beta=None, initial_state=None, chunk_size=64, scale=1.0, value_gate=False):
    """Kernel contract of ``linattn.ops``: q, k [B, H, T, Dk], v [B, H, T, Dv], g None | [B, H, T] | [B, H, T, Dk]
    (any strides) -> (o [B, H, T, Dv] in q's dtype, S [B, H, Dk, Dv] in float32, float64 for float64 inputs).

    ``chunk_size``: 16, 32 or 64 tokens (else a ValueError naming it); per key channel the chunk is 16 tokens.
    ``value_gate=True`` (for the backward): g is [B, H, T, Dv], one gate per value column, S_t = S_{t-1} diag(a_t)
    + k_t v_t^T.
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    q, k, v, g = unit_last(q), unit_last(k), unit_last(v), unit_last(g)
    dt = q.dtype
    k, v = k.to(dt), v.to(dt)
    gate = GATE_VALUE if value_gate else gate_kind(g, q.dim())
    acc = acc_dtype(dt)
    o = torch.empty(B, H, T, Dv, dtype=dt, device=q.device)
    S = torch.empty(B, H, Dk, Dv, dtype=acc, device=q.device)
    # Per key (or value) channel the kernel forms the exact [BT, BT, D] decay in registers: 16-token chunks
    # whatever chunk_size (still checked) says; the result is the same function either way.
    BT = block_t(chunk_size)
    if gate in (GATE_CHANNEL, GATE_VALUE):
        BT = 16
    # IEEE products for float32 operands (no TF32); for half operands the precision flag means nothing.
    dot_t = dot_dtype(dt, _chunk_linear_fwd)
    BK, BV = block_k(Dk), block_v(Dv)
    s0 = initial_state if initial_state is not None else S
    g_ = g if g is not None else q
    g_strides = (g_.stride(0), g_.stride(1), g_.stride(2))
    _chunk_linear_fwd[(triton.cdiv(Dv, BV), B * H)](
        q, k, v, g_, unit_last(s0), o, S, T, H, Dk, Dv, float(scale),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g_strides,
        *unit_last(s0).stride()[:3], *o.stride()[:3], *S.stride()[:3],
        GATE=gate, HAS_S0=initial_state is not None, FLOOR=LOG_GATE_FLOOR,
        DT=dot_t, PREC="ieee" if dot_t in (tl.float32, tl.float64) else "tf32", BT=BT, BK=BK, BV=BV,
        num_warps=8 if BK >= 128 else 4,
    )
    return o, S
