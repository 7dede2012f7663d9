"""Compiled CPU kernels (numba): one fused token loop for every rule, for prefill and for the decode step.

Per token and (batch, head) the state S [Dk, Dw] (Dw = Dv, or Dv + 1 with the normalizer z as a last column that
is written with the value 1) is swept once or twice while it sits in L1, and the read is rearranged so that no
second pass is needed for it:

    gated / accumulate:  o = S_new^T q = S^T (a * q) + (q . k) v           one pass: read S^T q, write a S + k v^T
    delta rules:         p = S^T k, r = S^T q (one pass), u = b (v - a p), o = a r + (q . k) u,
                         S <- a S + k u^T (second pass)

``a`` is exp(g) per head (or per key channel for ``gated``); exp(-inf) = 0 is an exact reset. The outputs are
scaled, then divided by the normalizer column with the library's eps convention. Work is split over (batch, head)
pairs with ``prange``; a small job runs the serial build of the same function (no thread wake-up).

Compiled on first use for each dtype and cached on disk (``cache=True``: next to this file, or in numba's user
cache directory when that is read-only, or ``NUMBA_CACHE_DIR``), so later processes load machine code.
"""

from __future__ import annotations

import math
import os
import threading
import types

import numba
import numpy as np
import torch

_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


def _builds(fn, flags: dict):
    """The parallel and the serial build of ``fn``, each under a name of its own.

    numba's disk cache names an entry by the function's qualified name and first line, not by its options: two
    builds of one function share one entry, and whichever compiled first is loaded for both (the parallel build
    then ran on one thread, or the serial one woke the pool). A copy of the function per build keeps them apart.
    """
    out = []
    for parallel in (True, False):
        name = f"{fn.__name__}_{'parallel' if parallel else 'serial'}"
        clone = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        clone.__qualname__, clone.__doc__ = name, fn.__doc__
        out.append(numba.njit(parallel=parallel, **flags)(clone))
    return tuple(out)


def _token_loop(q, k, v, g, beta, S, o, scale, eps, clamp, normalize, gated, delta, per_channel):
    """q, k [B, T, Hq, Dk]; v [B, T, H, Dv] (H a multiple of Hq: grouped value heads); g [B, T, H, 1 or Dk]
    (unused unless ``gated``; per key channel also on the delta rules, Kimi Delta Attention); beta [B, T, H]
    (unused unless ``delta``): float32. S [B, H, Dk, Dw] float32, updated in place; o [B, T, H, Dv] written.

    Every scalar is float32 too: a float64 constant would widen the inner loops and halve the vector width.
    """
    B, T, Hq, Dk = q.shape
    H, Dv = v.shape[2], v.shape[3]
    group = H // Hq  # grouped value heads: q/k head h // group serves value head h
    Dw = S.shape[3]
    sc = np.float32(scale)
    ep = np.float32(eps)
    work = np.empty((B * H, 6, max(Dk, Dw)), dtype=np.float32)  # scratch vectors: one allocation per call
    for bh in numba.prange(B * H):
        b = bh // H
        h = bh - b * H
        hq = h // group
        Sbh = S[b, h]
        r, p, w = work[bh, 0], work[bh, 1], work[bh, 2]
        qa, ga, kp = work[bh, 3, :Dk], work[bh, 4, :Dk], work[bh, 5]
        ga[:] = np.float32(1.0)
        for t in range(T):
            qt = q[b, t, hq]
            kt = k[b, t, hq]
            vt = v[b, t, h]
            a = np.float32(1.0)
            if gated and not per_channel:
                a = np.float32(math.exp(g[b, t, h, 0]))
            qk = np.float32(0.0)
            for i in range(Dk):
                qk += qt[i] * kt[i]
            if per_channel:  # diag(a) S: the reads S'^T q, S'^T k become S^T (a * q), S^T (a * k)
                for i in range(Dk):
                    ga[i] = np.float32(math.exp(g[b, t, h, i]))
                    qa[i] = qt[i] * ga[i]
                    kp[i] = kt[i] * ga[i]
            else:
                for i in range(Dk):
                    qa[i] = qt[i]
            kr = kp if per_channel else kt  # the key the prediction reads: S'^T k = S^T kr (times ap)
            ap = np.float32(1.0) if per_channel else a  # the gate still to apply to the prediction
            for j in range(Dv):
                w[j] = vt[j]
            if normalize:
                w[Dv] = np.float32(1.0)  # z is the memory of a constant value 1
            r[:] = np.float32(0.0)
            if delta:
                p[:] = np.float32(0.0)
                # Four rows per sweep: the partial sums p and r are loaded and stored once per four state rows.
                i4 = Dk - Dk % 4
                for i in range(0, i4, 4):
                    r0, r1, r2, r3 = Sbh[i], Sbh[i + 1], Sbh[i + 2], Sbh[i + 3]
                    k0, k1, k2, k3 = kr[i], kr[i + 1], kr[i + 2], kr[i + 3]
                    q0, q1, q2, q3 = qa[i], qa[i + 1], qa[i + 2], qa[i + 3]
                    for j in range(Dw):
                        s0, s1, s2, s3 = r0[j], r1[j], r2[j], r3[j]
                        p[j] += k0 * s0 + k1 * s1 + k2 * s2 + k3 * s3
                        r[j] += q0 * s0 + q1 * s1 + q2 * s2 + q3 * s3
                for i in range(i4, Dk):
                    row = Sbh[i]
                    ki = kr[i]
                    qi = qa[i]
                    for j in range(Dw):
                        s = row[j]
                        p[j] += ki * s
                        r[j] += qi * s
                bt = beta[b, t, h]
                for j in range(Dw):
                    w[j] = bt * (w[j] - ap * p[j])  # the write u (delta rules have no normalizer column)
                for i in range(Dk):
                    row = Sbh[i]
                    ki = kt[i]
                    ai = ga[i] if per_channel else a
                    for j in range(Dw):
                        row[j] = ai * row[j] + ki * w[j]
            else:
                for i in range(Dk):
                    row = Sbh[i]
                    ki = kt[i]
                    qi = qa[i]
                    ai = ga[i] if per_channel else a
                    for j in range(Dw):
                        s = row[j]
                        r[j] += qi * s
                        row[j] = ai * s + ki * w[j]
            if normalize:
                den = sc * (ap * r[Dv] + qk)
                den = max(den, ep) if clamp else den + ep
                for j in range(Dv):
                    o[b, t, h, j] = sc * (ap * r[j] + qk * w[j]) / den
            else:
                for j in range(Dv):
                    o[b, t, h, j] = sc * (ap * r[j] + qk * w[j])


token_loop_parallel, token_loop_serial = _builds(_token_loop, _FLAGS)


def _prefill(q, k, v, g, beta, cu, ST, o, scale, eps, clamp, normalize, gated, delta, per_channel, every, ckpt,
             ck_start):
    """The function of :func:`_token_loop` over packed sequences, on a transposed state (prefill).

    q, k [T, Hq, Dk]; v [T, H, Dv] (H a multiple of Hq); g [T, H, 1 or Dk]; beta [T, H]; o [T, H, Dv]. Sequence n
    is tokens ``cu[n] ... cu[n+1] - 1`` and runs from its own state ``ST [N, H, Dw, Dk]`` (updated in place); an
    unpacked batch is the case ``cu = [0, T, 2T, ...]`` of its flattened rows. A sequence never reads another's
    tokens, and one of length 0 keeps its state. ``every > 0`` (for the backward) stores the state entering tokens
    0, every, 2 every, ... of sequence n in ``ckpt[ck_start[n] + c]``.

    Each value column of S is a contiguous row of ST, so both reads (S^T k, S^T q) are dot products kept in
    registers and the write follows on the same row while it is in L1: one load and one store per state entry
    and token, where the [Dk, Dw] layout also loads and stores the partial read vector. The token's q and k are
    first copied to local arrays (the vectorizer then needs no alias checks against the state). The dot products
    need reordered sums (``reassoc``): rounding differs from the torch forms at the 1e-7 level.
    """
    N, H, Dw, Dk = ST.shape
    Hq = q.shape[1]
    Dv = v.shape[2]
    group = H // Hq
    sc = np.float32(scale)
    ep = np.float32(eps)
    work = np.empty((N * H, 6, max(Dk, Dw)), dtype=np.float32)  # scratch vectors: one allocation per call
    for nh in numba.prange(N * H):
        n = nh // H
        h = nh - n * H
        hq = h // group
        STbh = ST[n, h]
        r, w = work[nh, 0], work[nh, 1]
        qa, ka, ga, kp = work[nh, 2, :Dk], work[nh, 3, :Dk], work[nh, 4, :Dk], work[nh, 5, :Dk]
        t0 = cu[n]
        for t in range(t0, cu[n + 1]):
            if every > 0 and (t - t0) % every == 0:
                ckpt[ck_start[n] + (t - t0) // every, h] = STbh
            a = np.float32(1.0)
            if gated and not per_channel:
                a = np.float32(math.exp(g[t, h, 0]))
            qk = np.float32(0.0)
            for i in range(Dk):
                qa[i] = q[t, hq, i]
                ka[i] = k[t, hq, i]
                qk += qa[i] * ka[i]
            if per_channel:  # diag(a) S: the reads S'^T q, S'^T k become S^T (a * q), S^T (a * k)
                for i in range(Dk):
                    ga[i] = np.float32(math.exp(g[t, h, i]))
                    qa[i] = qa[i] * ga[i]
                    kp[i] = ka[i] * ga[i]
            else:
                for i in range(Dk):
                    ga[i] = a
            kr = kp if per_channel else ka  # the key the prediction reads: S'^T k = ap * S^T kr
            ap = np.float32(1.0) if per_channel else a  # the gate still to apply to the reads
            for j in range(Dv):
                w[j] = v[t, h, j]
            if normalize:
                w[Dv] = np.float32(1.0)  # z is the memory of a constant value 1
            if delta:
                bt = beta[t, h]
                for j in range(Dw):
                    pj = np.float32(0.0)
                    rj = np.float32(0.0)
                    for i in range(Dk):
                        s = STbh[j, i]
                        pj += kr[i] * s
                        rj += qa[i] * s
                    uj = bt * (w[j] - ap * pj)
                    if per_channel:
                        for i in range(Dk):
                            STbh[j, i] = ga[i] * STbh[j, i] + ka[i] * uj
                    else:
                        for i in range(Dk):
                            STbh[j, i] = a * STbh[j, i] + ka[i] * uj
                    r[j] = rj
                    w[j] = uj
            else:
                for j in range(Dw):
                    rj = np.float32(0.0)
                    wj = w[j]
                    for i in range(Dk):
                        s = STbh[j, i]
                        rj += qa[i] * s
                        STbh[j, i] = ga[i] * s + ka[i] * wj
                    r[j] = rj
            if normalize:
                den = sc * (ap * r[Dv] + qk)
                den = max(den, ep) if clamp else den + ep
                for j in range(Dv):
                    o[t, h, j] = sc * (ap * r[j] + qk * w[j]) / den
            else:
                for j in range(Dv):
                    o[t, h, j] = sc * (ap * r[j] + qk * w[j])


_FLAGS_T = dict(_FLAGS, fastmath={"contract", "reassoc", "nsz"})  # nsz: a sum starting at +0.0 vectorizes
prefill_parallel, prefill_serial = _builds(_prefill, _FLAGS_T)


def _backward(q, k, v, g, beta, cu, ckpt, ck_start, every, dST, do, dq, dk, dv, dg, dbeta, scale, gated, delta,
              per_channel):
    """Gradients of :func:`_prefill` (unnormalized, ``group`` 1: q, k [T, H, Dk], v and do [T, H, Dw]).

    Reverse time, one segment of ``every`` tokens at a time: the segment's states are recomputed from its
    checkpoint into a buffer (``every`` x Dw x Dk per head, kept small enough for L2), then walked backwards.
    ``dST`` [N, H, Dw, Dk] enters as the gradient of the final states and leaves as that of the initial ones.
    With S' = diag(a) S_{t-1}, e = v - S'^T k, u = b e (u = v without delta), S_t = S' + k u^T, o = s S_t^T q and
    D = dS_t + s q do^T, per token:
        du = D^T k;  dv = b du, db = du . e, dp = -b du (dv = du, dp = 0 without delta)
        dS' = D + k dp^T;  dk = D u + S' dp;  dq = s (S' do + k (u . do));  dg = sum_j dS' * S' (over the
        value columns: per key channel, or over everything per head);  dS_{t-1} = diag(a) dS'.
    Each value row j of D depends only on row j of dS_t, so one sweep per token does all of it; dq, dk and dg
    collect in vectors of Dk. As in the forward, the token's vectors are first copied to local arrays.
    """
    N, H, Dw, Dk = dST.shape
    sc = np.float32(scale)
    for nh in numba.prange(N * H):
        n = nh // H
        h = nh - n * H
        dSbh = dST[n, h]
        buf = np.empty((every, Dw, Dk), dtype=np.float32)  # buf[m]: the state before the segment's token m
        err = np.empty((every, Dw), dtype=np.float32)  # e = v - S'^T k (delta rules)
        vec = np.empty((8, Dk), dtype=np.float32)
        qa, ka, kp, ga, acc_q, acc_k, acc_g = vec[0], vec[1], vec[2], vec[3], vec[4], vec[5], vec[6]
        u = np.empty(Dw, dtype=np.float32)
        t_begin, t_end = cu[n], cu[n + 1]
        segments = (t_end - t_begin + every - 1) // every
        for c in range(segments - 1, -1, -1):
            s0 = t_begin + c * every
            s1 = min(s0 + every, t_end)
            buf[0] = ckpt[ck_start[n] + c, h]
            for t in range(s0, s1):  # recompute: the forward's update, without the read
                m = t - s0
                for i in range(Dk):
                    ga[i] = np.float32(math.exp(g[t, h, i if per_channel else 0])) if gated else np.float32(1.0)
                    ka[i] = k[t, h, i]
                    kp[i] = ga[i] * ka[i]
                bt = beta[t, h] if delta else np.float32(1.0)
                Sin = buf[m]
                last = t == s1 - 1
                Sout = buf[m] if last else buf[m + 1]
                for j in range(Dw):
                    pj = np.float32(0.0)
                    if delta:
                        for i in range(Dk):
                            pj += kp[i] * Sin[j, i]
                    ej = v[t, h, j] - pj
                    err[m, j] = ej
                    if not last:
                        uj = bt * ej
                        for i in range(Dk):
                            Sout[j, i] = ga[i] * Sin[j, i] + ka[i] * uj
            for t in range(s1 - 1, s0 - 1, -1):
                m = t - s0
                Sp = buf[m]
                qk = np.float32(0.0)
                for i in range(Dk):
                    ga[i] = np.float32(math.exp(g[t, h, i if per_channel else 0])) if gated else np.float32(1.0)
                    qa[i] = q[t, h, i]
                    ka[i] = k[t, h, i]
                    qk += qa[i] * ka[i]
                    acc_q[i] = np.float32(0.0)
                    acc_k[i] = np.float32(0.0)
                    acc_g[i] = np.float32(0.0)
                bt = beta[t, h] if delta else np.float32(1.0)
                ud = np.float32(0.0)
                db = np.float32(0.0)
                for j in range(Dw):
                    dj = do[t, h, j]
                    uj = bt * err[m, j] if delta else v[t, h, j]
                    u[j] = uj
                    ud += uj * dj
                    duj = np.float32(0.0)
                    for i in range(Dk):
                        duj += dSbh[j, i] * ka[i]
                    duj += sc * dj * qk  # (D^T k)_j = (dS_t^T k)_j + s do_j (q . k)
                    if delta:
                        dv[t, h, j] = bt * duj
                        db += duj * err[m, j]
                        dpj = -bt * duj
                    else:
                        dv[t, h, j] = duj
                        dpj = np.float32(0.0)
                    sdj = sc * dj
                    for i in range(Dk):
                        sp = ga[i] * Sp[j, i]
                        dji = dSbh[j, i] + sdj * qa[i]
                        dsp = dji + dpj * ka[i]
                        acc_k[i] += dji * uj + sp * dpj
                        acc_q[i] += sp * dj
                        acc_g[i] += dsp * sp
                        dSbh[j, i] = ga[i] * dsp
                for i in range(Dk):
                    dq[t, h, i] = sc * (acc_q[i] + ka[i] * ud)
                    dk[t, h, i] = acc_k[i]
                if delta:
                    dbeta[t, h] = db
                if gated and per_channel:
                    for i in range(Dk):
                        dg[t, h, i] = acc_g[i]
                elif gated:
                    total = np.float32(0.0)
                    for i in range(Dk):
                        total += acc_g[i]
                    dg[t, h, 0] = total


backward_parallel, backward_serial = _builds(_backward, _FLAGS_T)


def _use_workqueue() -> None:
    """Run parallel loops on numba's own thread pool unless the user chose a layer.

    The OpenMP layer loads a second OpenMP runtime next to torch's; their idle threads spin against each other
    and on 2 cores made the torch chunk form 5x slower after one numba call (measured, docs/perf.md). The
    workqueue layer forbids concurrent launches, so ``run`` serializes parallel calls with a lock.
    """
    if not os.environ.get("NUMBA_THREADING_LAYER"):
        numba.config.THREADING_LAYER = "workqueue"


_use_workqueue()
_LOCK = threading.Lock()
# Below this many state elements swept per call (B*H*T*Dk*Dw), waking the thread pool costs more than it saves.
PARALLEL_MIN_WORK = 1 << 17


def _threads(work: int, pairs: int) -> int:
    """Threads for a call sweeping ``work`` state entries over ``pairs`` (sequence, head) pairs: torch's count,
    or 1 when the job is too small to pay for waking the pool."""
    threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    return threads if threads > 1 and pairs > 1 and work >= PARALLEL_MIN_WORK else 1


def _launch(parallel, serial, args, threads: int) -> None:
    if threads > 1:
        with _LOCK:
            numba.set_num_threads(threads)
            parallel(*args)
    else:
        serial(*args)


def run(q, k, v, g, beta, S, o, *, scale: float, eps: float, clamp: bool, normalize: bool) -> None:
    """Call the [Dk, Dw]-layout token loop on float32 NumPy views: ``g`` [B, T, H, 1 or Dk] or None, ``beta``
    [B, T, H] or None; ``S`` [B, H, Dk, Dv(+1)] is updated in place and ``o`` [B, T, H, Dv] written (decode)."""
    B, T, H, Dk = q.shape
    gated, delta = g is not None, beta is not None
    per_channel = gated and g.shape[3] != 1
    g = _DUMMY4 if g is None else g
    beta = _DUMMY3 if beta is None else beta
    args = (q, k, v, g, beta, S, o, scale, eps, clamp, normalize, gated, delta, per_channel)
    _launch(token_loop_parallel, token_loop_serial, args, _threads(B * H * T * S.shape[2] * S.shape[3], B * H))


def checkpoint_starts(cu: np.ndarray, every: int) -> tuple[np.ndarray, int]:
    """Index of each sequence's first checkpoint (one every ``every`` tokens) and the number of checkpoints."""
    counts = (np.diff(cu) + every - 1) // every
    starts = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    return starts, int(counts.sum())


def prefill(q, k, v, g, beta, cu, ST, o, *, scale: float, eps: float, clamp: bool, normalize: bool,
            every: int = 0) -> np.ndarray | None:
    """Call :func:`_prefill` on float32 NumPy views (``cu`` int64); ``ST`` [N, H, Dw, Dk] is updated in place and
    ``o`` [T, H, Dv] written. ``every > 0`` also returns the checkpoints ``[count, H, Dw, Dk]`` for
    :func:`backward`. Threads: torch's count."""
    N, H, Dw, Dk = ST.shape
    gated, delta = g is not None, beta is not None
    per_channel = gated and g.shape[2] != 1
    g = _DUMMY3 if g is None else g
    beta = _DUMMY2 if beta is None else beta
    if every > 0:
        ck_start, count = checkpoint_starts(cu, every)
        ckpt = np.empty((count, H, Dw, Dk), dtype=np.float32)
    else:
        ck_start, ckpt = _DUMMY_I, _DUMMY4
    args = (q, k, v, g, beta, cu, ST, o, scale, eps, clamp, normalize, gated, delta, per_channel, every, ckpt,
            ck_start)
    _launch(prefill_parallel, prefill_serial, args, _threads(q.shape[0] * H * Dw * Dk, N * H))
    return ckpt if every > 0 else None


def backward(q, k, v, g, beta, cu, ckpt, dST, do, *, scale: float, every: int):
    """Gradients of an unnormalized :func:`prefill` run (q, k at the value heads): returns (dq, dk, dv, dg, dbeta),
    dg and dbeta None without gate or beta; ``dST`` goes in as the final states' gradient and comes out as the
    initial states'."""
    N, H, Dw, Dk = dST.shape
    T = q.shape[0]
    gated, delta = g is not None, beta is not None
    per_channel = gated and g.shape[2] != 1
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dg = np.empty_like(g) if gated else _DUMMY3
    dbeta = np.empty((T, H), dtype=np.float32) if delta else _DUMMY2
    ck_start, _ = checkpoint_starts(cu, every)
    args = (q, k, v, _DUMMY3 if g is None else g, _DUMMY2 if beta is None else beta, cu, ckpt, ck_start, every,
            dST, do, dq, dk, dv, dg, dbeta, scale, gated, delta, per_channel)
    _launch(backward_parallel, backward_serial, args, _threads(T * H * Dw * Dk, N * H))
    return dq, dk, dv, (dg if gated else None), (dbeta if delta else None)


_DUMMY4 = np.zeros((1, 1, 1, 1), dtype=np.float32)
_DUMMY3 = np.zeros((1, 1, 1), dtype=np.float32)
_DUMMY2 = np.zeros((1, 1), dtype=np.float32)
_DUMMY_I = np.zeros(1, dtype=np.int64)
