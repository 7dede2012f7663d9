"""The prefill on the CPU (numba): the token loop of `linattn.kernels.cpu_loop` over packed sequences, on the
transposed state [Dw, Dk], in work units of (sequence, head, block of value rows) that a pool of threads splits;
it keeps state checkpoints for `linattn.kernels.cpu_backward` when asked.

One serial build, compiled on first use for each dtype and cached on disk (``cache=True``: next to this file, or
in numba's user cache directory when that is read-only, or ``NUMBA_CACHE_DIR``), so later processes load machine
code.
"""

from __future__ import annotations

import numba
import numpy as np

from linattn import buffers
from linattn.kernels import cpu_threads
from linattn.kernels.cpu_intrinsics import (
    FEATURE_CODES,
    PREFETCH_AHEAD,
    as_f32,
    checkpoint_starts,
    f32_pointer,
    features_jit,
    prefetch_span_jit,
)

# nsz: a sum starting at +0.0 vectorizes
_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract", "reassoc", "nsz"})


def _quad_delta(at, vec, Dk, mode, a, u0, u1, u2, u3):
    """Four rows of ST at address ``at`` through one delta token: s = a s + k u_j, then o_j = s . q and the next
    prediction p_j = s . k'. Returns (o0..o3, p0..p3).

    ``vec``: the address of the token's vectors [4, Dk]: gate per key channel, key, query, next key (addresses,
    not arrays: an array argument costs two atomic reference counts per call, more than the loop at Dk = 64).
    Called with ``Dk`` and ``mode`` (0: no gate, 1: ``a`` per head, 2: per key channel) as constants, and
    inlined: LLVM then knows the rows' distance, so the loop vectorizes without runtime alias checks and unrolls
    (with run-time widths the checks and the reductions around a short loop cost as much as the loop).
    """
    S = numba.carray(f32_pointer(at), (4, Dk))
    ga = numba.carray(f32_pointer(vec), (Dk,))
    ka = numba.carray(f32_pointer(vec + Dk * 4), (Dk,))
    qa = numba.carray(f32_pointer(vec + Dk * 8), (Dk,))
    kn = numba.carray(f32_pointer(vec + Dk * 12), (Dk,))
    o0 = o1 = o2 = o3 = p0 = p1 = p2 = p3 = np.float32(0.0)
    for i in range(Dk):
        ki = ka[i]
        if mode == 2:
            gi = ga[i]
            s0, s1, s2, s3 = gi * S[0, i], gi * S[1, i], gi * S[2, i], gi * S[3, i]
        elif mode == 1:
            s0, s1, s2, s3 = a * S[0, i], a * S[1, i], a * S[2, i], a * S[3, i]
        else:
            s0, s1, s2, s3 = S[0, i], S[1, i], S[2, i], S[3, i]
        s0 += ki * u0
        s1 += ki * u1
        s2 += ki * u2
        s3 += ki * u3
        S[0, i] = s0
        S[1, i] = s1
        S[2, i] = s2
        S[3, i] = s3
        qi, ni = qa[i], kn[i]
        o0 += qi * s0
        o1 += qi * s1
        o2 += qi * s2
        o3 += qi * s3
        p0 += ni * s0
        p1 += ni * s1
        p2 += ni * s2
        p3 += ni * s3
    return o0, o1, o2, o3, p0, p1, p2, p3


def _quad_plain(at, vec, Dk, mode, a, w0, w1, w2, w3):
    """`_quad_delta` without the prediction (gated, accumulate): s = a s + k w_j, o_j = s . q."""
    S = numba.carray(f32_pointer(at), (4, Dk))
    ga = numba.carray(f32_pointer(vec), (Dk,))
    ka = numba.carray(f32_pointer(vec + Dk * 4), (Dk,))
    qa = numba.carray(f32_pointer(vec + Dk * 8), (Dk,))
    o0 = o1 = o2 = o3 = np.float32(0.0)
    for i in range(Dk):
        ki = ka[i]
        if mode == 2:
            gi = ga[i]
            s0, s1, s2, s3 = gi * S[0, i], gi * S[1, i], gi * S[2, i], gi * S[3, i]
        elif mode == 1:
            s0, s1, s2, s3 = a * S[0, i], a * S[1, i], a * S[2, i], a * S[3, i]
        else:
            s0, s1, s2, s3 = S[0, i], S[1, i], S[2, i], S[3, i]
        s0 += ki * w0
        s1 += ki * w1
        s2 += ki * w2
        s3 += ki * w3
        S[0, i] = s0
        S[1, i] = s1
        S[2, i] = s2
        S[3, i] = s3
        qi = qa[i]
        o0 += qi * s0
        o1 += qi * s1
        o2 += qi * s2
        o3 += qi * s3
    return o0, o1, o2, o3


_INLINE = dict(nogil=True, error_model="numpy", fastmath={"contract", "reassoc", "nsz"}, inline="always")
_quad_delta_jit = numba.njit(**_INLINE)(_quad_delta)
_quad_plain_jit = numba.njit(**_INLINE)(_quad_plain)


def _quads_delta(at, vec, Dk, mode, a, u0, u1, u2, u3):
    """`_quad_delta` with ``Dk`` and ``mode`` as constants for the head widths 64 and 128."""
    if Dk == 64:
        if mode == 0:
            return _quad_delta_jit(at, vec, 64, 0, a, u0, u1, u2, u3)
        if mode == 1:
            return _quad_delta_jit(at, vec, 64, 1, a, u0, u1, u2, u3)
        return _quad_delta_jit(at, vec, 64, 2, a, u0, u1, u2, u3)
    if mode == 0:
        return _quad_delta_jit(at, vec, 128, 0, a, u0, u1, u2, u3)
    if mode == 1:
        return _quad_delta_jit(at, vec, 128, 1, a, u0, u1, u2, u3)
    return _quad_delta_jit(at, vec, 128, 2, a, u0, u1, u2, u3)


def _quads_plain(at, vec, Dk, mode, a, w0, w1, w2, w3):
    """`_quad_plain` with ``Dk`` and ``mode`` as constants for the head widths 64 and 128."""
    if Dk == 64:
        if mode == 0:
            return _quad_plain_jit(at, vec, 64, 0, a, w0, w1, w2, w3)
        if mode == 1:
            return _quad_plain_jit(at, vec, 64, 1, a, w0, w1, w2, w3)
        return _quad_plain_jit(at, vec, 64, 2, a, w0, w1, w2, w3)
    if mode == 0:
        return _quad_plain_jit(at, vec, 128, 0, a, w0, w1, w2, w3)
    if mode == 1:
        return _quad_plain_jit(at, vec, 128, 1, a, w0, w1, w2, w3)
    return _quad_plain_jit(at, vec, 128, 2, a, w0, w1, w2, w3)


_quads_delta_jit = numba.njit(**_INLINE)(_quads_delta)
_quads_plain_jit = numba.njit(**_INLINE)(_quads_plain)


def _prefill(q, k, v, alpha, beta, cu, ST, o, den, scale, eps, clamp, normalize, gated, delta, per_channel, every,
             ckpt, ck_start, cols, fcode, u0, u1, r0, r1):
    """The function of the token loop (`linattn.kernels.cpu_loop`) over packed sequences, on a transposed state.

    q, k [T, Hq, Dk]; v [T, H, Dv] (H a multiple of Hq), float32, or int16 holding bfloat16 bits (q, k and v
    alike: each element is widened as it is loaded); alpha [T, H, 1 or Dk] the gates already exponentiated
    (a = exp(g)); beta [T, H]; o [T, H, Dv]; den [T, H] scratch for the normalizer's read. Sequence n is tokens
    ``cu[n] ... cu[n+1] - 1`` and runs from its own state ``ST [N, H, Dw, Dk]`` (updated in place); an unpacked
    batch is the case ``cu = [0, T, 2T, ...]`` of its flattened rows. A sequence never reads another's tokens, and
    one of length 0 keeps its state. ``every > 0`` (for the backward) stores the state entering tokens 0, every,
    2 every, ... of sequence n in ``ckpt[ck_start[n] + c]``.

    Row j of ST is value column j of S, and its recurrence needs no other row: u_j = b (v_j - a p_j) with
    p_j = S[:, j] . k. So the work splits into blocks of ``cols`` rows (the last one also takes the normalizer
    row), each run through the whole sequence on its own: a block stays in L1 (16 KiB at Dk = 128) and the units
    (sequence, head, block) spread evenly over threads. Per token one sweep over each row both writes it and reads
    it: s = a s + k u_j, o_j = s . q, and the next token's prediction p_j = s . k' (k' the next key, times its
    per-channel gate), so each state entry is loaded and stored once per token. Rows go in pairs (the token's
    vectors loaded once per two rows). The dot products need reordered sums (``reassoc``): rounding differs from
    the torch forms at the 1e-7 level. ``fcode`` (`FEATURE_CODES`): q and k are raw and each row is mapped as it
    is loaded (relu1, elu1 or l2: no mapped copy of q and k in memory); 0: q and k are features already.

    This call runs units ``u0 ... u1 - 1`` (unit = (sequence, head, block) in that order), then scales and
    normalizes the (token, head) rows ``r0 ... r1 - 1`` of ``o``: `prefill` runs it whole on one thread, or
    the units on several threads and then the rows (one serial build, compiled once; a ``prange`` build of this
    body took five times as long to compile as the serial one).
    """
    N, H, Dw, Dk = ST.shape
    Hq = q.shape[1]
    Dv = v.shape[2]
    group = H // Hq
    sc = np.float32(scale)
    ep = np.float32(eps)
    nblk = max(1, Dv // cols)
    for unit in range(u0, u1):
        nh = unit // nblk
        blk = unit - nh * nblk
        n = nh // H
        h = nh - n * H
        hq = h // group
        j0 = blk * cols
        j1 = Dw if blk == nblk - 1 else j0 + cols
        STbh = ST[n, h]
        base = ST.ctypes.data  # ST, q, k, v, o, alpha are C-contiguous (the caller checks)
        q_at, k_at, v_at, o_at, alpha_at = q.ctypes.data, k.ctypes.data, v.ctypes.data, o.ctypes.data, alpha.ctypes.data
        qb, vb = q.itemsize, v.itemsize  # bytes per element: 4, or 2 for bfloat16 bits
        # Local vectors, one allocation each: LLVM then knows that none of them is the state.
        vec = np.empty((4, Dk), dtype=np.float32)  # the token's vectors, passed to the quads by address
        vec_at = vec.ctypes.data
        ga, ka, qa, kn = vec[0], vec[1], vec[2], vec[3]
        pn = np.empty(j1 - j0, dtype=np.float32)
        t0, t1 = cu[n], cu[n + 1]
        for t in range(t0, t1):
            if every > 0 and (t - t0) % every == 0:  # one by one: a slice copy compiles numba's shape checks
                c = ck_start[n] + (t - t0) // every
                for j in range(j0, j1):
                    for i in range(Dk):
                        ckpt[c, h, j, i] = STbh[j, i]
            tp = t + PREFETCH_AHEAD
            if tp < t1:
                prefetch_span_jit(q_at + (tp * Hq + hq) * Dk * qb, Dk * qb)
                prefetch_span_jit(k_at + (tp * Hq + hq) * Dk * qb, Dk * qb)
                prefetch_span_jit(v_at + ((tp * H + h) * Dv + j0) * vb, (min(j1, Dv) - j0) * vb)
                prefetch_span_jit(o_at + ((tp * H + h) * Dv + j0) * 4, (min(j1, Dv) - j0) * 4)
                if per_channel:
                    prefetch_span_jit(alpha_at + (tp * H + h) * Dk * 4, Dk * 4)
            a = np.float32(1.0)
            if per_channel:
                for i in range(Dk):
                    ga[i] = alpha[t, h, i]
            elif gated:
                a = alpha[t, h, 0]
            mode = 2 if per_channel else (1 if gated else 0)
            for i in range(Dk):
                qa[i] = as_f32(q[t, hq, i])
                ka[i] = as_f32(k[t, hq, i])
            if fcode != 0:
                features_jit(qa, qa, fcode)
                features_jit(ka, ka, fcode)
            if delta:
                if t == t0:  # the first prediction, from the entering state: p_j = S[:, j] . (a-gated k)
                    for i in range(Dk):
                        kn[i] = ka[i] * ga[i] if per_channel else ka[i]
                    for j in range(j0, j1):
                        row = STbh[j]
                        pj = np.float32(0.0)
                        for i in range(Dk):
                            pj += kn[i] * row[i]
                        pn[j - j0] = pj
                tn = t + 1 if t + 1 < t1 else t  # the next token's key (the last token's prediction is unused)
                for i in range(Dk):
                    kn[i] = as_f32(k[tn, hq, i])
                if fcode != 0:
                    features_jit(kn, kn, fcode)
                if per_channel:
                    for i in range(Dk):
                        kn[i] = kn[i] * alpha[tn, h, i]
                ap = np.float32(1.0) if per_channel else a  # the gate still to apply to the prediction
                bt = beta[t, h]
                j = j0
                if Dk == 64 or Dk == 128:
                    while j + 3 < j1:
                        at = base + (((n * H + h) * Dw + j) * Dk) * 4
                        u0 = bt * (as_f32(v[t, h, j]) - ap * pn[j - j0])
                        u1 = bt * (as_f32(v[t, h, j + 1]) - ap * pn[j + 1 - j0])
                        u2 = bt * (as_f32(v[t, h, j + 2]) - ap * pn[j + 2 - j0])
                        u3 = bt * (as_f32(v[t, h, j + 3]) - ap * pn[j + 3 - j0])
                        o0, o1, o2, o3, p0, p1, p2, p3 = _quads_delta_jit(at, vec_at, Dk, mode, a, u0, u1, u2, u3)
                        o[t, h, j] = sc * o0
                        o[t, h, j + 1] = sc * o1
                        o[t, h, j + 2] = sc * o2
                        o[t, h, j + 3] = sc * o3
                        pn[j - j0] = p0
                        pn[j + 1 - j0] = p1
                        pn[j + 2 - j0] = p2
                        pn[j + 3 - j0] = p3
                        j += 4
                while j + 1 < j1:
                    u0 = bt * (as_f32(v[t, h, j]) - ap * pn[j - j0])
                    u1 = bt * (as_f32(v[t, h, j + 1]) - ap * pn[j + 1 - j0])
                    o0 = np.float32(0.0)
                    o1 = np.float32(0.0)
                    p0 = np.float32(0.0)
                    p1 = np.float32(0.0)
                    if per_channel:
                        for i in range(Dk):
                            s0 = ga[i] * STbh[j, i] + ka[i] * u0
                            s1 = ga[i] * STbh[j + 1, i] + ka[i] * u1
                            STbh[j, i] = s0
                            STbh[j + 1, i] = s1
                            o0 += qa[i] * s0
                            o1 += qa[i] * s1
                            p0 += kn[i] * s0
                            p1 += kn[i] * s1
                    elif gated:
                        for i in range(Dk):
                            s0 = a * STbh[j, i] + ka[i] * u0
                            s1 = a * STbh[j + 1, i] + ka[i] * u1
                            STbh[j, i] = s0
                            STbh[j + 1, i] = s1
                            o0 += qa[i] * s0
                            o1 += qa[i] * s1
                            p0 += kn[i] * s0
                            p1 += kn[i] * s1
                    else:
                        for i in range(Dk):
                            s0 = STbh[j, i] + ka[i] * u0
                            s1 = STbh[j + 1, i] + ka[i] * u1
                            STbh[j, i] = s0
                            STbh[j + 1, i] = s1
                            o0 += qa[i] * s0
                            o1 += qa[i] * s1
                            p0 += kn[i] * s0
                            p1 += kn[i] * s1
                    o[t, h, j] = sc * o0
                    o[t, h, j + 1] = sc * o1
                    pn[j - j0] = p0
                    pn[j + 1 - j0] = p1
                    j += 2
                if j < j1:
                    u0 = bt * (as_f32(v[t, h, j]) - ap * pn[j - j0])
                    o0 = np.float32(0.0)
                    p0 = np.float32(0.0)
                    for i in range(Dk):
                        s0 = (ga[i] if per_channel else a) * STbh[j, i] + ka[i] * u0
                        STbh[j, i] = s0
                        o0 += qa[i] * s0
                        p0 += kn[i] * s0
                    o[t, h, j] = sc * o0
                    pn[j - j0] = p0
            else:
                j = j0
                if Dk == 64 or Dk == 128:
                    while j + 3 < j1:
                        at = base + (((n * H + h) * Dw + j) * Dk) * 4
                        w3 = as_f32(v[t, h, j + 3]) if j + 3 < Dv else np.float32(1.0)  # z remembers a constant value 1
                        o0, o1, o2, o3 = _quads_plain_jit(at, vec_at, Dk, mode, a, as_f32(v[t, h, j]),
                                                          as_f32(v[t, h, j + 1]), as_f32(v[t, h, j + 2]), w3)
                        o[t, h, j] = o0
                        o[t, h, j + 1] = o1
                        o[t, h, j + 2] = o2
                        if j + 3 < Dv:
                            o[t, h, j + 3] = o3
                        else:
                            den[t, h] = o3
                        j += 4
                while j + 1 < j1:
                    w0 = as_f32(v[t, h, j])
                    w1 = as_f32(v[t, h, j + 1]) if j + 1 < Dv else np.float32(1.0)  # z remembers a constant value 1
                    o0 = np.float32(0.0)
                    o1 = np.float32(0.0)
                    if per_channel:
                        for i in range(Dk):
                            s0 = ga[i] * STbh[j, i] + ka[i] * w0
                            s1 = ga[i] * STbh[j + 1, i] + ka[i] * w1
                            STbh[j, i] = s0
                            STbh[j + 1, i] = s1
                            o0 += qa[i] * s0
                            o1 += qa[i] * s1
                    elif gated:
                        for i in range(Dk):
                            s0 = a * STbh[j, i] + ka[i] * w0
                            s1 = a * STbh[j + 1, i] + ka[i] * w1
                            STbh[j, i] = s0
                            STbh[j + 1, i] = s1
                            o0 += qa[i] * s0
                            o1 += qa[i] * s1
                    else:
                        for i in range(Dk):
                            s0 = STbh[j, i] + ka[i] * w0
                            s1 = STbh[j + 1, i] + ka[i] * w1
                            STbh[j, i] = s0
                            STbh[j + 1, i] = s1
                            o0 += qa[i] * s0
                            o1 += qa[i] * s1
                    o[t, h, j] = o0
                    if j + 1 < Dv:
                        o[t, h, j + 1] = o1
                    else:
                        den[t, h] = o1
                    j += 2
                if j < j1:
                    w0 = as_f32(v[t, h, j]) if j < Dv else np.float32(1.0)
                    o0 = np.float32(0.0)
                    for i in range(Dk):
                        s0 = (ga[i] if per_channel else a) * STbh[j, i] + ka[i] * w0
                        STbh[j, i] = s0
                        o0 += qa[i] * s0
                    if j < Dv:
                        o[t, h, j] = o0
                    else:
                        den[t, h] = o0
    if not delta:  # scale, and divide by the normalizer's read: o = s S^T q / (s z . q) with the eps convention
        for th in range(r0, r1):
            t = th // H
            h = th - t * H
            if normalize:
                d = sc * den[t, h]
                d = max(d, ep) if clamp else d + ep
                f = sc / d
            else:
                f = sc
            for j in range(Dv):
                o[t, h, j] *= f


prefill_kernel = numba.njit(**_FLAGS)(_prefill)


def prefill_cols(pairs: int, Dv: int, threads: int) -> int:
    """Value rows per prefill work unit: a whole head (the token's setup is paid once per unit and token), halved
    down to 32 rows while there are fewer than four units per thread, so that a few heads still spread evenly
    over the threads (8 heads on 2 threads stay whole; 1 head of Dv = 128 becomes 4 units)."""
    cols = max(Dv, 1)
    while threads > 1 and pairs * (Dv // cols) < 4 * threads and cols >= 64:
        cols //= 2
    return cols


def prefill(q, k, v, g, beta, cu, ST, o, *, scale: float, eps: float, clamp: bool, normalize: bool,
            every: int = 0, cols: int | None = None, fmap: str | None = None, threads: int = 1) -> np.ndarray | None:
    """Call `_prefill` on float32 NumPy views (``cu`` int64; q, k and v may instead all be int16 views of
    bfloat16 tensors, read in place); ``ST`` [N, H, Dw, Dk] is updated in place and ``o`` [T, H, Dv] written;
    ``fmap``: a feature map named in `FEATURE_CODES`, applied by the kernel to q and k as it loads them.
    ``every > 0`` also returns the checkpoints ``[count, H, Dw, Dk]`` for `backward`. ``cols``: value rows
    per work unit (None: `prefill_cols`). ``threads``: how many run it (the caller decides)."""
    N, H, Dw, Dk = ST.shape
    gated, delta = g is not None, beta is not None
    if delta and normalize:
        raise ValueError("normalize: the delta rules keep no normalizer")
    per_channel = gated and g.shape[2] != 1
    if fmap not in FEATURE_CODES:
        raise ValueError(f"fmap: the kernel applies {', '.join(sorted(m for m in FEATURE_CODES if m))} or None, "
                         f"got {fmap!r}")
    fcode = FEATURE_CODES[fmap]
    alpha = np.exp(g) if gated else _DUMMY3  # exp(-inf) = 0: an exact reset
    beta = _DUMMY2 if beta is None else beta
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (np.float32, np.int16)):
        raise ValueError(f"prefill: q, k, v must all be float32 or all int16 (bfloat16 bits), got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if every > 0:
        ck_start, count = checkpoint_starts(cu, every)
        ckpt = buffers.empty((count, H, Dw, Dk)).numpy()
    else:
        ck_start, ckpt = _DUMMY_I, _DUMMY4
    if not all(x.flags.c_contiguous for x in (q, k, v, alpha, ST, o)):
        raise ValueError("prefill: q, k, v, g, ST and o must be C-contiguous")
    den = np.empty((q.shape[0], H), dtype=np.float32) if normalize else _DUMMY2
    cols = prefill_cols(N * H, v.shape[2], threads) if cols is None else int(cols)
    if cols < 1:
        raise ValueError(f"cols: expected a positive number of value rows, got {cols}")
    args = (q, k, v, alpha, beta, cu, ST, o, den, scale, eps, clamp, normalize, gated, delta, per_channel, every, ckpt,
            ck_start, cols, fcode)
    units, rows = N * H * max(1, v.shape[2] // cols), q.shape[0] * H
    if threads <= 1:
        prefill_kernel(*args, 0, units, 0, rows)
    else:  # the units on threads, then (after all of them: a row's normalizer is the last block's) the rows
        cpu_threads.on_threads(lambda lo, hi: prefill_kernel(*args, lo, hi, 0, 0), units, threads)
        if not delta:
            cpu_threads.on_threads(lambda lo, hi: prefill_kernel(*args, 0, 0, lo, hi), rows, threads)
    return ckpt if every > 0 else None


_DUMMY4 = np.zeros((1, 1, 1, 1), dtype=np.float32)
_DUMMY3 = np.zeros((1, 1, 1), dtype=np.float32)
_DUMMY2 = np.zeros((1, 1), dtype=np.float32)
_DUMMY_I = np.zeros(1, dtype=np.int64)
