"""The compiled Mamba-2 decode step (HF's ``mamba2_selective_state_update``): everything after the projections in
one numba call, one pass over each head's state.

Per sequence b and head h (group ``h // (H / G)`` of B and C), in float32:
``dt = dt[b, h] + dt_bias[h]``, ``dt = softplus(dt)`` (when asked; torch's formula: x above 20 as it is, else
log1p(exp(x))), clamped to [dt_lo, dt_hi]; ``a = exp(dt A[h])``; for each state row n
``S[n, :] = a S[n, :] + B[n] (dt x[:])`` and ``y[:] = sum_n C[n] S[n, :]``; then ``y += D x`` and ``y *= silu(z)``
(HF's order: the skip term first, then the gate).

The caller has proved shapes, dtypes and layouts and passes raw addresses with element strides (a stride 0 where
HF's ``expand`` left one); this module trusts its arguments. Every input is float32 or bfloat16 (``dtypes``: the
IN_* bits of those held as bfloat16, widened as they are read); the state is float32 and updated in place, each
head one contiguous ``[N, P]`` block (linattn's layout, ``LAYOUT_NP``) or ``[P, N]`` block (HF's own,
``LAYOUT_PN``) at any batch and head strides; y is written contiguous ``[B, H, P]`` in x's dtype (rounded to
nearest even once from float32). A call runs the (sequence, head) units ``lo`` to ``hi`` (unit b * H + h): the
caller splits a step over threads by giving each its own range.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types

from linattn.kernels import cpu_threads
from linattn.kernels.cpu_intrinsics import as_f32, bf16_round_jit, exp32_jit, f32_pointer, i16_pointer

LAYOUT_NP, LAYOUT_PN = 0, 1
# Which inputs are bfloat16 (bits of ``dtypes``; the rest float32). y is in x's dtype.
IN_X, IN_DT, IN_A, IN_BIAS, IN_D, IN_Z, IN_B, IN_C = 1, 2, 4, 8, 16, 32, 64, 128
SOFTPLUS_THRESHOLD = 20.0  # torch's default: above it softplus(x) is x
# contract: fused multiply-adds; reassoc + nsz: the read's sums vectorize. NaN and Inf still propagate.
_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract", "reassoc", "nsz"})
_INLINE = dict(_FLAGS, inline="always")


def _load(at, index, bf16):
    """Element ``index`` (in elements) of the float32, or bfloat16 when ``bf16``, array at address ``at``."""
    if bf16:
        return as_f32(numba.carray(i16_pointer(at + 2 * index), (1,))[0])
    return numba.carray(f32_pointer(at + 4 * index), (1,))[0]


def _row(at, start, stride, bf16, out):
    """``out[i] = array[start + i * stride]`` as float32, for the length of ``out``."""
    if bf16:
        src16 = numba.carray(i16_pointer(at + 2 * start), (1 + (out.shape[0] - 1) * stride,))
        for i in range(out.shape[0]):
            out[i] = as_f32(src16[i * stride])
    else:
        src = numba.carray(f32_pointer(at + 4 * start), (1 + (out.shape[0] - 1) * stride,))
        for i in range(out.shape[0]):
            out[i] = src[i * stride]


_load_jit = numba.njit(**_INLINE)(_load)
_row_jit = numba.njit(**_INLINE)(_row)


def _sweep_np4(at, N, P, a, Bv, Cv, w, r):
    """One head in linattn's layout, ``S [N, P]`` at address ``at``: ``S[n] = a S[n] + Bv[n] w`` and ``r = sum_n
    Cv[n] S[n]`` (the new rows), four rows per pass over r. Only for call sites that pass N and P as constants:
    LLVM then knows the rows' distance and vectorizes without alias checks (with run-time widths a four-row loop
    ran scalar in linattn's decode kernel)."""
    S = numba.carray(f32_pointer(at), (N, P))
    for j in range(P):
        r[j] = np.float32(0.0)
    n4 = N - N % 4
    for n in range(0, n4, 4):
        b0, b1, b2, b3 = Bv[n], Bv[n + 1], Bv[n + 2], Bv[n + 3]
        c0, c1, c2, c3 = Cv[n], Cv[n + 1], Cv[n + 2], Cv[n + 3]
        for j in range(P):
            wj = w[j]
            s0 = a * S[n, j] + b0 * wj
            s1 = a * S[n + 1, j] + b1 * wj
            s2 = a * S[n + 2, j] + b2 * wj
            s3 = a * S[n + 3, j] + b3 * wj
            S[n, j], S[n + 1, j], S[n + 2, j], S[n + 3, j] = s0, s1, s2, s3
            r[j] += c0 * s0 + c1 * s1 + c2 * s2 + c3 * s3
    for n in range(n4, N):
        for j in range(P):
            s = a * S[n, j] + Bv[n] * w[j]
            S[n, j] = s
            r[j] += Cv[n] * s


def _sweep_np(at, N, P, a, Bv, Cv, w, r):
    """`_sweep_np4` at run-time widths: two rows per pass over r."""
    S = numba.carray(f32_pointer(at), (N, P))
    for j in range(P):
        r[j] = np.float32(0.0)
    n2 = N - N % 2
    for n in range(0, n2, 2):
        s0r, s1r = S[n], S[n + 1]
        b0, b1, c0, c1 = Bv[n], Bv[n + 1], Cv[n], Cv[n + 1]
        for j in range(P):
            wj = w[j]
            s0 = a * s0r[j] + b0 * wj
            s1 = a * s1r[j] + b1 * wj
            s0r[j], s1r[j] = s0, s1
            r[j] += c0 * s0 + c1 * s1
    for n in range(n2, N):
        sr = S[n]
        for j in range(P):
            s = a * sr[j] + Bv[n] * w[j]
            sr[j] = s
            r[j] += Cv[n] * s


def _sweep_pn(at, N, P, a, Bv, Cv, w, r):
    """One head in HF's layout, ``S [P, N]`` at address ``at``: ``S[p] = a S[p] + w[p] Bv`` and ``r[p] = Cv .
    S[p]`` (the new row), one row at a time (the dot product vectorizes along n)."""
    S = numba.carray(f32_pointer(at), (P, N))
    for p in range(P):
        sr = S[p]
        wp = w[p]
        acc = np.float32(0.0)
        for n in range(N):
            s = a * sr[n] + wp * Bv[n]
            sr[n] = s
            acc += Cv[n] * s
        r[p] = acc


_sweep_np4_jit = numba.njit(**_INLINE)(_sweep_np4)
_sweep_np_jit = numba.njit(**_INLINE)(_sweep_np)
_sweep_pn_jit = numba.njit(**_INLINE)(_sweep_pn)


def _softplus(x):
    """torch's softplus of a float32 (beta 1, threshold 20), computed in float64 and rounded once."""
    if x > np.float32(SOFTPLUS_THRESHOLD):
        return x
    return np.float32(math.log1p(math.exp(np.float64(x))))


_softplus_jit = numba.njit(**_INLINE)(_softplus)


def _step(x_at, sx_b, sx_h, sx_p, dt_at, sdt_b, sdt_h, A_at, sA_h, bias_at, sbias_h, D_at, sD_b, sD_h, sD_p,
          z_at, sz_b, sz_h, sz_p, B_at, sB_b, sB_g, sB_n, C_at, sC_b, sC_g, sC_n, S_at, sS_b, sS_h, layout, y_at,
          Bsz, H, G, P, N, softplus, dtypes, lo, hi, dt_lo, dt_hi):
    """Units ``lo`` to ``hi`` (b * H + h) of one decode token, as the module says. Addresses ``*_at`` (0: that
    optional input is absent: dt_bias, D, z), element strides ``s*``: x, z ``[B, H, P]``, dt ``[B, H]``, A and
    dt_bias ``[H]``, D ``[B, H, P]``, B and C ``[B, G, N]``, the state's batch and head strides (its rows
    contiguous as ``layout`` says), y contiguous ``[B, H, P]``. Returns 0."""
    x_bf, dt_bf, A_bf = dtypes & IN_X, dtypes & IN_DT, dtypes & IN_A
    bias_bf, D_bf, z_bf, B_bf, C_bf = dtypes & IN_BIAS, dtypes & IN_D, dtypes & IN_Z, dtypes & IN_B, dtypes & IN_C
    lo32, hi32 = np.float32(dt_lo), np.float32(dt_hi)
    heads_per_group = H // G
    # Local vectors, one allocation each: LLVM then knows that none of them is the state.
    xv = np.empty(P, dtype=np.float32)
    w = np.empty(P, dtype=np.float32)
    r = np.empty(P, dtype=np.float32)
    dv = np.empty(P, dtype=np.float32)
    zv = np.empty(P, dtype=np.float32)
    Bv = np.empty(N, dtype=np.float32)
    Cv = np.empty(N, dtype=np.float32)
    y32 = numba.carray(f32_pointer(y_at), (Bsz * H * P,))
    y16 = numba.carray(i16_pointer(y_at), (Bsz * H * P,))
    last = -1  # the (sequence, group) whose B and C rows are loaded
    for unit in range(lo, hi):
        b, h = unit // H, unit % H
        grp = b * G + h // heads_per_group
        if grp != last:
            _row_jit(B_at, b * sB_b + (h // heads_per_group) * sB_g, sB_n, B_bf, Bv)
            _row_jit(C_at, b * sC_b + (h // heads_per_group) * sC_g, sC_n, C_bf, Cv)
            last = grp
        # the time step in HF's order, each operation rounded to float32 as HF's float32 path rounds it
        d = _load_jit(dt_at, b * sdt_b + h * sdt_h, dt_bf)
        if bias_at != 0:
            d = d + _load_jit(bias_at, h * sbias_h, bias_bf)
        if softplus:
            d = _softplus_jit(d)
        if d < lo32:  # (comparisons: a NaN passes through, as torch.clamp passes it)
            d = lo32
        if d > hi32:
            d = hi32
        a = exp32_jit(d * _load_jit(A_at, h * sA_h, A_bf))
        _row_jit(x_at, b * sx_b + h * sx_h, sx_p, x_bf, xv)
        for j in range(P):
            w[j] = d * xv[j]
        head = S_at + (b * sS_b + h * sS_h) * 4
        if layout == LAYOUT_PN:
            if N == 128:
                _sweep_pn_jit(head, 128, P, a, Bv, Cv, w, r)
            else:
                _sweep_pn_jit(head, N, P, a, Bv, Cv, w, r)
        elif N == 128 and P == 64:  # Mamba-2's usual head (state 128, head dim 64), widths as constants
            _sweep_np4_jit(head, 128, 64, a, Bv, Cv, w, r)
        elif N == 64 and P == 64:
            _sweep_np4_jit(head, 64, 64, a, Bv, Cv, w, r)
        else:
            _sweep_np_jit(head, N, P, a, Bv, Cv, w, r)
        if D_at != 0:
            _row_jit(D_at, b * sD_b + h * sD_h, sD_p, D_bf, dv)
            for j in range(P):
                r[j] = r[j] + dv[j] * xv[j]
        if z_at != 0:  # silu(z) = z / (1 + exp(-z))
            _row_jit(z_at, b * sz_b + h * sz_h, sz_p, z_bf, zv)
            for j in range(P):
                r[j] = r[j] * (zv[j] / (np.float32(1.0) + exp32_jit(-zv[j])))
        out = unit * P
        if x_bf:  # y in x's dtype: each float32 result rounded once, as torch's cast rounds it
            for j in range(P):
                y16[out + j] = bf16_round_jit(r[j])
        else:
            for j in range(P):
                y32[out + j] = r[j]
    return 0


# Compiled for one signature when this module is imported (loaded from the cache after the first time); the
# compiled wrapper is called directly, as linattn's decode kernel is: numba's dispatcher would spend microseconds
# matching 43 arguments.
_SIGNATURE = types.int64(*([types.int64] * 41), types.float64, types.float64)
_dispatcher = numba.njit(_SIGNATURE, **_FLAGS)(_step)
step = getattr(_dispatcher.overloads.get(_dispatcher.signatures[0]), "entry_point", None) or _dispatcher
LO = 39  # the index of ``lo`` among `step`'s arguments (``hi`` follows)


def step_split(threads: int, args: tuple) -> int:
    """`step` over all its units (``args[LO:LO + 2]`` ignored) split over up to ``threads`` threads (no more than
    numba has) of the Python pool, each running the serial kernel on its own range of (sequence, head) units."""
    units = args[32] * args[33]

    def part(lo: int, hi: int) -> None:
        step(*args[:LO], lo, hi, *args[LO + 2:])

    cpu_threads.on_threads(part, units, min(threads, units, numba.config.NUMBA_NUM_THREADS))
    return 0
