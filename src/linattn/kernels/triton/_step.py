"""Fused one-token decode step for every rule: decay, (delta: predict), write and read in one kernel, in place.

One program owns a block of BV value columns of one (batch, head) state and the whole key dimension, so the
prediction S^T k of the delta rules (a sum over keys) needs no second pass: every value column is independent.
The state is read once and written once; q, k, v, g and beta are tiny. Accumulation is in the state's dtype
(float32, or float64 for float64 states); inputs of any float dtype are cast to it on load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linattn.kernels.triton._common import GATE_NONE, block_k, block_v, gate_kind


@triton.jit
def _step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, o_ptr,
    H, DK, DV,
    sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sb_b, sb_h,
    ss_b, ss_h, ss_k, so_b, so_h, DVO, eps,
    GATE: tl.constexpr, DELTA: tl.constexpr, NORM: tl.constexpr, CLAMP: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    s_ptrs = s_ptr + i_b * ss_b + i_h * ss_h + rk[:, None] * ss_k + rv[None, :]
    m_s = mk[:, None] & mv[None, :]
    S = tl.load(s_ptrs, mask=m_s, other=0.0)
    acc = S.dtype
    k = tl.load(k_ptr + i_b * sk_b + i_h * sk_h + rk, mask=mk, other=0.0).to(acc)
    q = tl.load(q_ptr + i_b * sq_b + i_h * sq_h + rk, mask=mk, other=0.0).to(acc)
    v = tl.load(v_ptr + i_b * sv_b + i_h * sv_h + rv, mask=rv < DVO, other=0.0).to(acc)
    if NORM:  # the normalizer z is the state's last column, the memory of a constant value 1
        v = tl.where(rv == DVO, 1.0, v)
    if GATE == 1:
        g = tl.load(g_ptr + i_b * sg_b + i_h * sg_h).to(acc)
        S = S * tl.exp(g)
    elif GATE == 2:
        g = tl.load(g_ptr + i_b * sg_b + i_h * sg_h + rk, mask=mk, other=0.0).to(acc)
        S = S * tl.exp(g)[:, None]
    if DELTA:
        beta = tl.load(b_ptr + i_b * sb_b + i_h * sb_h).to(acc)
        v = beta * (v - tl.sum(k[:, None] * S, axis=0))
    S = S + k[:, None] * v[None, :]
    o = tl.sum(q[:, None] * S, axis=0)
    tl.store(s_ptrs, S, mask=m_s)
    if NORM:  # one block holds every column: read the denominator q^T z and divide, the library's eps convention
        den = tl.sum(tl.where(rv == DVO, o, 0.0), axis=0)
        if CLAMP:
            den = tl.maximum(den, eps)
        else:
            den = den + eps
        o = o / den
    tl.store(o_ptr + i_b * so_b + i_h * so_h + rv, o.to(o_ptr.dtype.element_ty), mask=rv < DVO)


def step(q, k, v, *, g=None, beta=None, state, inplace=False, delta: bool = False, normalize: bool = False,
         eps: float = 0.0, eps_mode: str = "add", out_dtype=None):
    """One token, the contract of ``linattn.ops`` step kernels: q (already scaled), k [B, H, Dk], v [B, H, Dv],
    g None | [B, H] | [B, H, Dk], beta [B, H] (delta rules), state [B, H, Dk, Dv] (any strides with unit stride
    along Dv, e.g. the [S | z] view). Returns (o [B, H, Dv] in the state's dtype, S). No autograd (see
    ``linattn.kernels.triton`` for how gradients are served).

    ``normalize=True`` (the whole-call entry point): the state is [S | z] with Dv + 1 columns, v has Dv; the kernel
    writes the 1 of z itself, divides by q^T z with ``eps``/``eps_mode`` and returns o [B, H, Dv] in ``out_dtype``:
    one launch for the whole decode step.
    """
    B, H, Dk = k.shape
    Dvo = v.shape[-1]
    Dw = Dvo + 1 if normalize else Dvo
    S = state if inplace else state.clone()
    if S.stride(-1) != 1:
        raise ValueError("state: the Triton step needs unit stride along Dv")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    gate = gate_kind(g, q.dim())
    if gate != GATE_NONE and g.stride(-1) != 1:
        g = g.contiguous()
    o = torch.empty(B, H, Dvo, dtype=out_dtype or S.dtype, device=S.device)
    BK = block_k(Dk)
    BV = max(16, triton.next_power_of_2(Dw)) if normalize else block_v(Dw)  # normalized: one block, z included
    g_ = g if g is not None else q  # an unused pointer for rules without a gate or beta
    b_ = beta if beta is not None else q
    _step_kernel[(triton.cdiv(Dw, BV), B * H)](
        q, k, v, g_, b_, S, o, H, Dk, Dw,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g_.stride(0), g_.stride(1), b_.stride(0), b_.stride(1),
        S.stride(0), S.stride(1), S.stride(2), o.stride(0), o.stride(1), Dvo, float(eps),
        GATE=gate, DELTA=delta, NORM=normalize, CLAMP=eps_mode == "clamp", BK=BK, BV=BV,
    )
    return o, S
