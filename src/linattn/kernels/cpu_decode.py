"""The compiled decode step: feature map, gate check, write and read in one numba call (serial, or split over
threads for large states).

At batch 1 a step (H=8, D=64: one pass over 133 KB of state) is a few microseconds of work, so the layout of the
loops decides the time. This module has its own one-token kernel, written so that LLVM vectorizes every loop over
the state without runtime alias checks:

- the token's features, gates and the value row are copied to local arrays (each its own allocation, which LLVM
  knows aliases nothing else), so the only memory the sweeps write is the state and one accumulator;
- each state entry is loaded and stored once per pass, and the read accumulator ``r`` (and ``p`` for the delta
  rules) once per several rows: four for the delta rules' read and for the normalized rules at D = 64 and 128
  (widths compiled in), two otherwise (with run-time widths LLVM ran a four-row loop scalar, 7x slower,
  presumably because the alias checks between the rows exceed its limit);
- an in-place update passes the same array as source and destination (dependence distance 0, no check); a copy
  (``inplace=False``) reads the old state and writes the new one in the same sweep, instead of copying first;
- ``exp`` (the gates, the elu1 map) is computed inline in float64 and rounded once to float32: libm's ``expf`` is
  a call per element that stops vectorization, and it is what made the elu1 map and per-channel gates slow;
- the dot products and the l2 sums of squares may be reassociated (``fastmath`` reassoc), so they vectorize too:
  rounding then differs from the torch step at the 1e-7 level.

The caller (``linattn.step``) has already proved that shapes, dtypes, layouts and the state's record fit, and
passes raw addresses of contiguous CPU tensors: the state float32, the token's tensors float32 or bfloat16 (a
bfloat16 input is widened as it is read, and o, in v's dtype, rounded to nearest even once from float32, so a
bfloat16 step equals the float32 step on the widened values, bit for bit). This module trusts its arguments.
Only the gate values are checked here, before anything is written, because reading them costs a torch reduction
in Python.
"""

from __future__ import annotations

import ctypes

import numba
import numpy as np
from numba import types

from linattn.kernels import cpu_threads

# FEATURE_CODES: the codes decode.py asks this module for
from linattn.kernels.cpu_intrinsics import (  # noqa: F401
    FEATURE_CODES,
    as_f32,
    bf16_round_jit,
    exp32_jit,
    f32_pointer,
    features_jit,
    i16_pointer,
)

OK, BAD_GATE = 0, 1
# Which inputs are bfloat16 (bits of the ``dtypes`` argument; the rest float32). o is in v's dtype; the state is
# float32 always.
BF16_Q, BF16_K, BF16_V, BF16_G, BF16_BETA = 1, 2, 4, 8, 16
KIND_BATCH, KIND_QK_HEADS, KIND_VALUE_HEADS = 0, 1, 2  # how a split step cuts its work (split_of)
# contract: fused multiply-adds; reassoc + nsz: reductions vectorize (a sum that starts at +0.0 needs nsz). No
# nnan/ninf: NaN and Inf inputs still propagate, and the NaN tests below stay tests.
_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract", "reassoc", "nsz"})
_INLINE = dict(_FLAGS, inline="always")


def _sweep_write_read(Sin, Sout, qa, k, ga, w, r):
    """``r = Sin^T qa`` and ``Sout = diag(ga) Sin + k w^T`` in one pass over [D, Dw] (a gate per head: the same
    value in every entry of ``ga``). Two rows per inner loop, so ``r`` is loaded and stored once per two state
    rows; with four rows of run-time width LLVM ran the loop scalar (7x slower).
    """
    D, Dw = Sin.shape
    for j in range(Dw):
        r[j] = np.float32(0.0)
    i2 = D - D % 2
    for i in range(0, i2, 2):
        s0, s1, d0, d1 = Sin[i], Sin[i + 1], Sout[i], Sout[i + 1]
        q0, q1, k0, k1, a0, a1 = qa[i], qa[i + 1], k[i], k[i + 1], ga[i], ga[i + 1]
        for j in range(Dw):
            x0, x1 = s0[j], s1[j]
            wj = w[j]
            r[j] += q0 * x0 + q1 * x1
            d0[j] = a0 * x0 + k0 * wj
            d1[j] = a1 * x1 + k1 * wj
    for i in range(i2, D):
        s, d = Sin[i], Sout[i]
        qi, ki, ai = qa[i], k[i], ga[i]
        for j in range(Dw):
            x = s[j]
            r[j] += qi * x
            d[j] = ai * x + ki * w[j]


def _sweep_write_read4(in_at, out_at, D, Dw, qa, k, ga, w, r):
    """`_sweep_write_read` on the head at address ``in_at`` (written at ``out_at``), four rows per inner loop.

    Only for call sites that pass ``D`` and ``Dw`` as constants: LLVM then knows the distance between the rows
    and needs no alias checks (with run-time widths it ran this loop scalar, presumably over its limit of checks).
    On the 133 KB state of H=8, D=64 this sweep took 2.6 us against 3.2 us with two rows (micro-benchmark).
    """
    Sin = numba.carray(f32_pointer(in_at), (D, Dw))
    Sout = numba.carray(f32_pointer(out_at), (D, Dw))
    for j in range(Dw):
        r[j] = np.float32(0.0)
    i4 = D - D % 4
    for i in range(0, i4, 4):
        q0, q1, q2, q3 = qa[i], qa[i + 1], qa[i + 2], qa[i + 3]
        k0, k1, k2, k3 = k[i], k[i + 1], k[i + 2], k[i + 3]
        a0, a1, a2, a3 = ga[i], ga[i + 1], ga[i + 2], ga[i + 3]
        for j in range(Dw):
            x0, x1, x2, x3 = Sin[i, j], Sin[i + 1, j], Sin[i + 2, j], Sin[i + 3, j]
            wj = w[j]
            r[j] += q0 * x0 + q1 * x1 + q2 * x2 + q3 * x3
            Sout[i, j] = a0 * x0 + k0 * wj
            Sout[i + 1, j] = a1 * x1 + k1 * wj
            Sout[i + 2, j] = a2 * x2 + k2 * wj
            Sout[i + 3, j] = a3 * x3 + k3 * wj
    for i in range(i4, D):
        for j in range(Dw):
            x = Sin[i, j]
            r[j] += qa[i] * x
            Sout[i, j] = ga[i] * x + k[i] * w[j]


def _sweep_read2(Sin, k, q, p, r):
    """``p = Sin^T k`` and ``r = Sin^T q`` in one pass (the delta rules' prediction and read), four rows at a time."""
    D, Dw = Sin.shape
    for j in range(Dw):
        p[j] = np.float32(0.0)
        r[j] = np.float32(0.0)
    i4 = D - D % 4
    for i in range(0, i4, 4):
        s0, s1, s2, s3 = Sin[i], Sin[i + 1], Sin[i + 2], Sin[i + 3]
        k0, k1, k2, k3 = k[i], k[i + 1], k[i + 2], k[i + 3]
        q0, q1, q2, q3 = q[i], q[i + 1], q[i + 2], q[i + 3]
        for j in range(Dw):
            x0, x1, x2, x3 = s0[j], s1[j], s2[j], s3[j]
            p[j] += k0 * x0 + k1 * x1 + k2 * x2 + k3 * x3
            r[j] += q0 * x0 + q1 * x1 + q2 * x2 + q3 * x3
    for i in range(i4, D):
        s = Sin[i]
        ki, qi = k[i], q[i]
        for j in range(Dw):
            x = s[j]
            p[j] += ki * x
            r[j] += qi * x


def _sweep_write(Sin, Sout, ga, k, u):
    """``Sout = diag(ga) Sin + k u^T`` (a gate per head: the same value in every entry of ``ga``)."""
    D, Dw = Sin.shape
    for i in range(D):
        s, d = Sin[i], Sout[i]
        ai, ki = ga[i], k[i]
        for j in range(Dw):
            d[j] = ai * s[j] + ki * u[j]


_sweep_write_read_jit = numba.njit(**_INLINE)(_sweep_write_read)
_sweep_write_read4_jit = numba.njit(**_INLINE)(_sweep_write_read4)
_sweep_read2_jit = numba.njit(**_INLINE)(_sweep_read2)
_sweep_write_jit = numba.njit(**_INLINE)(_sweep_write)




def _arrays(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D, Dv, gate_width, normalize, delta):
    """The step's raw addresses as float32 arrays (shapes as `_decode` says): q, k, v, g, beta, S, S_new, o; an
    absent g or beta is a dummy view of q."""
    Dw = Dv + 1 if normalize else Dv
    gated = gate_width > 0
    q = numba.carray(f32_pointer(q_at), (B, Hq, D))
    k = numba.carray(f32_pointer(k_at), (B, Hq, D))
    v = numba.carray(f32_pointer(v_at), (B, HV, Dv))
    g = numba.carray(f32_pointer(g_at if gated else q_at), (B, HV, gate_width if gated else 1))
    beta = numba.carray(f32_pointer(beta_at if delta else q_at), (B, HV))
    S = numba.carray(f32_pointer(S_at), (B, HV, D, Dw))
    S_new = numba.carray(f32_pointer(out_at), (B, HV, D, Dw))
    o = numba.carray(f32_pointer(o_at), (B, HV, Dv))
    return q, k, v, g, beta, S, S_new, o


def _arrays16(q_at, k_at, v_at, g_at, beta_at, o_at, B, Hq, HV, D, Dv, gate_width, delta):
    """The same addresses as int16 arrays (bfloat16 bits): q, k, v, g, beta, o; only those that `_decode`'s
    ``dtypes`` marks bfloat16 are read (or written), the rest are never touched."""
    gated = gate_width > 0
    q = numba.carray(i16_pointer(q_at), (B, Hq, D))
    k = numba.carray(i16_pointer(k_at), (B, Hq, D))
    v = numba.carray(i16_pointer(v_at), (B, HV, Dv))
    g = numba.carray(i16_pointer(g_at if gated else q_at), (B, HV, gate_width if gated else 1))
    beta = numba.carray(i16_pointer(beta_at if delta else q_at), (B, HV))
    o = numba.carray(i16_pointer(o_at), (B, HV, Dv))
    return q, k, v, g, beta, o


def _bad_gates(g):
    """Whether any log-gate is above 0 or NaN (checked before anything is written); float32 or bfloat16 bits."""
    bad = False
    B, HV, width = g.shape
    for b in range(B):
        for h in range(HV):
            for i in range(width):
                bad |= not as_f32(g[b, h, i]) <= np.float32(0.0)  # NaN too
    return bad


def _widen(x, out):
    """``out = x``: a row of bfloat16 bits as float32."""
    for i in range(x.shape[0]):
        out[i] = as_f32(x[i])


_arrays_jit = numba.njit(**_INLINE)(_arrays)
_arrays16_jit = numba.njit(**_INLINE)(_arrays16)
_widen_jit = numba.njit(**_INLINE)(_widen)
_bad_gates_jit = numba.njit(**_INLINE)(_bad_gates)


def _decode_any(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D, Dv, gate_width, code, clamp,
                normalize, delta, dtypes, scale, eps):
    """One token: q, k [B, Hq, D]; v, o [B, HV, Dv]; g [B, HV, gate_width] (gate_width 0: no gate); beta [B, HV]
    (read when ``delta``); the state S [B, HV, D, Dw] at ``S_at`` (Dw = Dv + 1 with the normalizer column), the new
    state written at ``out_at`` (the same address: in place). Value head h reads q/k head h // (HV / Hq). ``clamp``,
    ``normalize``, ``delta`` are 0 or 1. ``dtypes``: the BF16_* bits of the inputs held as bfloat16 (widened to
    float32 as they are read; o is written in v's dtype, rounded to nearest even), 0 when all are float32; the
    state is float32. Returns OK, or BAD_GATE with nothing written.
    """
    q, k, v, g, beta, S, S_new, o = _arrays_jit(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D,
                                                Dv, gate_width, normalize, delta)
    q16, k16, v16, g16, beta16, o16 = _arrays16_jit(q_at, k_at, v_at, g_at, beta_at, o_at, B, Hq, HV, D, Dv,
                                                    gate_width, delta)
    q_bf, k_bf, v_bf = dtypes & BF16_Q, dtypes & BF16_K, dtypes & BF16_V
    g_bf, beta_bf = dtypes & BF16_G, dtypes & BF16_BETA
    gated, per_channel, in_place = gate_width > 0, gate_width > 1, out_at == S_at
    if gated and (_bad_gates_jit(g16) if g_bf else _bad_gates_jit(g)):
        return BAD_GATE
    sc, ep = np.float32(scale), np.float32(eps)
    Dw = S.shape[3]
    # Local vectors, one allocation each: LLVM then knows that none of them is the state.
    qf = np.empty(D, dtype=np.float32)
    kf = np.empty(D, dtype=np.float32)
    qa = np.empty(D, dtype=np.float32)
    ka = np.empty(D, dtype=np.float32)
    ga = np.empty(D, dtype=np.float32)
    w = np.empty(Dw, dtype=np.float32)
    r = np.empty(Dw, dtype=np.float32)
    p = np.empty(Dw, dtype=np.float32)
    group = HV // Hq
    for b in range(B):
        for hq in range(Hq):  # query/key head hq of sequence b and the value heads it serves, through one token
            if q_bf:  # a bfloat16 row widened into ka first (free until the per-channel delta read)
                _widen_jit(q16[b, hq], ka)
                features_jit(ka, qf, code)
            else:
                features_jit(q[b, hq], qf, code)
            if k_bf:
                _widen_jit(k16[b, hq], ka)
                features_jit(ka, kf, code)
            else:
                features_jit(k[b, hq], kf, code)
            qk = np.float32(0.0)
            for i in range(D):
                qk += qf[i] * kf[i]
            for h in range(hq * group, (hq + 1) * group):
                a = np.float32(1.0)
                if per_channel:  # diag(a) S: the read S_new^T q becomes S^T (a * q), the gate rides on q
                    if g_bf:
                        for i in range(D):
                            ga[i] = exp32_jit(as_f32(g16[b, h, i]))
                            qa[i] = qf[i] * ga[i]
                    else:
                        for i in range(D):
                            ga[i] = exp32_jit(g[b, h, i])
                            qa[i] = qf[i] * ga[i]
                else:
                    if gated:
                        a = exp32_jit(as_f32(g16[b, h, 0]) if g_bf else g[b, h, 0])
                    for i in range(D):
                        ga[i] = a
                        qa[i] = qf[i]
                if v_bf:
                    _widen_jit(v16[b, h], w)
                else:
                    for j in range(Dv):
                        w[j] = v[b, h, j]
                if normalize:
                    w[Dv] = np.float32(1.0)  # z is the memory of a constant value 1
                if delta:  # u = beta (v - S^T (a k)), S <- diag(a) S + k u^T, o = S^T (a q) + (q.k) u
                    bt = as_f32(beta16[b, h]) if beta_bf else beta[b, h]
                    if per_channel:  # the gates ride on k and q for the reads
                        for i in range(D):
                            ka[i] = kf[i] * ga[i]
                        _sweep_read2_jit(S[b, h], ka, qa, p, r)
                        for j in range(Dw):
                            w[j] = bt * (w[j] - p[j])
                    else:
                        _sweep_read2_jit(S[b, h], kf, qf, p, r)
                        for j in range(Dw):
                            w[j] = bt * (w[j] - a * p[j])
                    if in_place:  # the head is still in L1 from the read
                        _sweep_write_jit(S[b, h], S[b, h], ga, kf, w)
                    else:
                        _sweep_write_jit(S[b, h], S_new[b, h], ga, kf, w)
                else:  # o = S_new^T q = S^T (a q) + (q.k) w
                    head = ((b * HV + h) * D * Dw) * 4
                    at, to = S_at + head, out_at + head
                    # the usual head sizes with the normalizer column, widths as constants (see the sweep)
                    # (in place, the same variable twice: LLVM then sees one array, not two that might overlap)
                    if D == 64 and Dw == 65 and in_place:
                        _sweep_write_read4_jit(at, at, 64, 65, qa, kf, ga, w, r)
                    elif D == 64 and Dw == 65:
                        _sweep_write_read4_jit(at, to, 64, 65, qa, kf, ga, w, r)
                    elif D == 128 and Dw == 129 and in_place:
                        _sweep_write_read4_jit(at, at, 128, 129, qa, kf, ga, w, r)
                    elif D == 128 and Dw == 129:
                        _sweep_write_read4_jit(at, to, 128, 129, qa, kf, ga, w, r)
                    elif in_place:
                        _sweep_write_read_jit(S[b, h], S[b, h], qa, kf, ga, w, r)
                    else:
                        _sweep_write_read_jit(S[b, h], S_new[b, h], qa, kf, ga, w, r)
                ra = np.float32(1.0) if per_channel else a
                den = np.float32(1.0)
                if normalize:
                    den = sc * (ra * r[Dv] + qk)
                    den = max(den, ep) if clamp else den + ep
                if v_bf:  # o in v's dtype: each float32 result rounded once, as torch's cast rounds it
                    for j in range(Dv):
                        o16[b, h, j] = bf16_round_jit(sc * (ra * r[j] + qk * w[j]) / den)
                elif normalize:
                    for j in range(Dv):
                        o[b, h, j] = sc * (ra * r[j] + qk * w[j]) / den
                else:
                    for j in range(Dv):
                        o[b, h, j] = sc * (ra * r[j] + qk * w[j])
    return OK


_decode_any_jit = numba.njit(**_INLINE)(_decode_any)


def _decode(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D, Dv, gate_width, code, clamp,
            normalize, delta, scale, eps):
    """`_decode_any` with every input float32: ``dtypes`` is the constant 0, so LLVM drops the bfloat16 branches
    and the float32 step runs the code it ran before bfloat16 existed (one argument fewer to unbox, too: measured
    0.08-0.14 us of a 4.7 us step)."""
    return _decode_any_jit(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D, Dv, gate_width, code,
                           clamp, normalize, delta, 0, scale, eps)


def _decode_bf16(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D, Dv, gate_width, code, clamp,
                 normalize, delta, dtypes, scale, eps):
    """`_decode_any` with some inputs bfloat16 (``dtypes`` their BF16_* bits)."""
    return _decode_any_jit(q_at, k_at, v_at, g_at, beta_at, S_at, out_at, o_at, B, Hq, HV, D, Dv, gate_width, code,
                           clamp, normalize, delta, dtypes, scale, eps)


# Compiled for one signature when this module is imported (loaded from the cache after the first time).
_SIGNATURE = types.int64(*([types.int64] * 18), types.float64, types.float64)
_dispatcher = numba.njit(_SIGNATURE, **_FLAGS)(_decode)
# The bfloat16 step: compiled (or loaded from the cache) on its first call, so a float32 user never waits for it.
_SIGNATURE_BF16 = types.int64(*([types.int64] * 19), types.float64, types.float64)
_dispatcher_bf16 = numba.njit(**_FLAGS)(_decode_bf16)
_ENTRIES: dict = {}
# The compiled wrapper of that signature, called directly: numba's dispatcher spends about as long finding the
# overload for 20 arguments as the kernel of a small state takes (measured 1.7 of 2.9 us). The caller passes
# Python ints and floats only, in this order; anything else is a TypeError from the wrapper.
decode = getattr(_dispatcher.overloads.get(_dispatcher.signatures[0]), "entry_point", None) or _dispatcher


def decode_bf16(*args) -> int:
    """`decode` with the ``dtypes`` argument after ``delta`` (the BF16_* bits of the inputs held as bfloat16);
    the compiled wrapper, called directly after the first call as `decode` is."""
    entry = _ENTRIES.get("bf16")
    if entry is None:
        _dispatcher_bf16.compile(_SIGNATURE_BF16.args)
        entry = getattr(_dispatcher_bf16.overloads.get(_SIGNATURE_BF16.args), "entry_point", None) or _dispatcher_bf16
        _ENTRIES["bf16"] = entry
    return entry(*args)


def split_of(args: tuple) -> tuple[int, int, int, int, int, int, int, int]:
    """How `decode`'s work splits : by sequence (B > 1), else by query/key head (Hq > 1), else
    by value head of the one group (B = Hq = 1, e.g. Mamba-2's one group of B/C); as (kind, units, value heads per
    query/key head, and the elements per unit of q/k, v/o, g, beta and the state)."""
    B, Hq, HV, D, Dv, gate_width, normalize = args[8], args[9], args[10], args[11], args[12], args[13], args[16]
    Dw = Dv + 1 if normalize else Dv
    group = HV // Hq
    if B > 1:
        return KIND_BATCH, B, group, Hq * D, HV * Dv, HV * gate_width, HV, HV * D * Dw
    if Hq > 1:
        return KIND_QK_HEADS, Hq, group, D, group * Dv, group * gate_width, group, group * D * Dw
    return KIND_VALUE_HEADS, HV, group, 0, Dv, gate_width, 1, D * Dw


def _chunk(args: tuple, split: tuple, lo: int, hi: int, dtypes: int) -> tuple:
    """`decode`'s arguments for units ``lo`` to ``hi`` of ``split`` (`split_of`), the inputs ``dtypes`` marks
    bfloat16 two bytes an element."""
    kind, _, group, qs, vs, gs, bs, ss = split

    def size(bit: int) -> int:  # bytes per element of the input that BF16_* bit marks
        return 2 if dtypes & bit else 4

    n = hi - lo
    shape = (n, args[9], args[10]) if kind == KIND_BATCH else (
        (1, n, n * group) if kind == KIND_QK_HEADS else (1, 1, n))
    return (args[0] + lo * qs * size(BF16_Q), args[1] + lo * qs * size(BF16_K), args[2] + lo * vs * size(BF16_V),
            args[3] + lo * gs * size(BF16_G), args[4] + lo * bs * size(BF16_BETA), args[5] + lo * ss * 4,
            args[6] + lo * ss * 4, args[7] + lo * vs * size(BF16_V), *shape, *args[11:])


def decode_split(threads: int, *args, dtypes: int = 0) -> int:
    """`decode` with its work (`split_of`) split over up to ``threads`` threads (no more than numba has) of the
    Python pool; same arguments after the thread count, same return; ``dtypes`` as `decode_bf16` takes it (0: all
    float32).

    Each thread runs the one serial build on its own slice, given as address offsets: no parallel build to compile.
    The gates are all checked here first, so a bad one still leaves nothing written.
    """
    gate_width, g_at, B, HV = args[13], args[3], args[8], args[10]
    if gate_width > 0 and _bad_gate_values(g_at, B * HV * gate_width, dtypes & BF16_G):
        return BAD_GATE
    split = split_of(args)
    status = [OK]

    def part(lo: int, hi: int) -> None:
        part_args = _chunk(args, split, lo, hi, dtypes)
        res = decode_bf16(*part_args[:18], dtypes, *part_args[18:]) if dtypes else decode(*part_args)
        if res != OK:
            status[0] = res

    cpu_threads.on_threads(part, split[1], min(threads, split[1], numba.config.NUMBA_NUM_THREADS))
    return status[0]


def _bad_gate_values(g_at: int, count: int, bf16: int) -> bool:
    """Whether any of the ``count`` log-gates at ``g_at`` (float32, or bfloat16 bits when ``bf16``) is above 0 or
    NaN (a NumPy view, no copy)."""
    if bf16:  # bfloat16 is the top half of a float32: widened by a shift
        bits = np.ctypeslib.as_array(ctypes.cast(g_at, ctypes.POINTER(ctypes.c_uint16)), shape=(count,))
        g = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        g = np.ctypeslib.as_array(ctypes.cast(g_at, ctypes.POINTER(ctypes.c_float)), shape=(count,))
    return not bool((g <= 0).all())
