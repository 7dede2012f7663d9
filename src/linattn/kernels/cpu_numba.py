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

import numba
import numpy as np
import torch

_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


def _token_loop(q, k, v, g, beta, S, o, scale, eps, clamp, normalize, gated, delta, per_channel):
    """q, k [B, T, H, Dk]; v [B, T, H, Dv]; g [B, T, H, 1 or Dk] (unused unless ``gated``); beta [B, T, H]
    (unused unless ``delta``): float32. S [B, H, Dk, Dw] float32, updated in place; o [B, T, H, Dv] written.

    Every scalar is float32 too: a float64 constant would widen the inner loops and halve the vector width.
    """
    B, T, H, Dk = q.shape
    Dv = v.shape[3]
    Dw = S.shape[3]
    sc = np.float32(scale)
    ep = np.float32(eps)
    work = np.empty((B * H, 5, max(Dk, Dw)), dtype=np.float32)  # scratch vectors: one allocation per call
    for bh in numba.prange(B * H):
        b = bh // H
        h = bh - b * H
        Sbh = S[b, h]
        r, p, w = work[bh, 0], work[bh, 1], work[bh, 2]
        qa, ga = work[bh, 3, :Dk], work[bh, 4, :Dk]
        ga[:] = np.float32(1.0)
        for t in range(T):
            qt = q[b, t, h]
            kt = k[b, t, h]
            vt = v[b, t, h]
            a = np.float32(1.0)
            if gated and not per_channel:
                a = np.float32(math.exp(g[b, t, h, 0]))
            qk = np.float32(0.0)
            for i in range(Dk):
                qk += qt[i] * kt[i]
            if per_channel:  # diag(a) S: the read S_new^T q becomes S^T (a * q), the gate rides on q
                for i in range(Dk):
                    ga[i] = np.float32(math.exp(g[b, t, h, i]))
                    qa[i] = qt[i] * ga[i]
            else:
                for i in range(Dk):
                    qa[i] = qt[i]
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
                    k0, k1, k2, k3 = kt[i], kt[i + 1], kt[i + 2], kt[i + 3]
                    q0, q1, q2, q3 = qa[i], qa[i + 1], qa[i + 2], qa[i + 3]
                    for j in range(Dw):
                        s0, s1, s2, s3 = r0[j], r1[j], r2[j], r3[j]
                        p[j] += k0 * s0 + k1 * s1 + k2 * s2 + k3 * s3
                        r[j] += q0 * s0 + q1 * s1 + q2 * s2 + q3 * s3
                for i in range(i4, Dk):
                    row = Sbh[i]
                    ki = kt[i]
                    qi = qa[i]
                    for j in range(Dw):
                        s = row[j]
                        p[j] += ki * s
                        r[j] += qi * s
                bt = beta[b, t, h]
                for j in range(Dw):
                    w[j] = bt * (w[j] - a * p[j])  # the write u (delta rules have no normalizer column)
                for i in range(Dk):
                    row = Sbh[i]
                    ki = kt[i]
                    for j in range(Dw):
                        row[j] = a * row[j] + ki * w[j]
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
            ra = np.float32(1.0) if per_channel else a
            if normalize:
                den = sc * (ra * r[Dv] + qk)
                den = max(den, ep) if clamp else den + ep
                for j in range(Dv):
                    o[b, t, h, j] = sc * (ra * r[j] + qk * w[j]) / den
            else:
                for j in range(Dv):
                    o[b, t, h, j] = sc * (ra * r[j] + qk * w[j])


token_loop_parallel = numba.njit(parallel=True, **_FLAGS)(_token_loop)
token_loop_serial = numba.njit(**_FLAGS)(_token_loop)


def _token_loop_t(q, k, v, g, beta, ST, o, scale, eps, clamp, normalize, gated, delta, per_channel):
    """The same function as :func:`_token_loop` on a transposed state ``ST [B, H, Dw, Dk]`` (prefill).

    Each value column of S is then a contiguous row, so both reads (S^T k, S^T q) are dot products kept in
    registers and the write follows on the same row while it is in L1: one load and one store per state entry
    and token, where the [Dk, Dw] layout also loads and stores the partial read vector. The token's q and k are
    first copied to local arrays (the vectorizer then needs no alias checks against the state). The dot products
    need reordered sums (``reassoc``): rounding differs from the torch forms at the 1e-7 level.
    """
    B, T, H, Dk = q.shape
    Dv = v.shape[3]
    Dw = ST.shape[2]
    sc = np.float32(scale)
    ep = np.float32(eps)
    work = np.empty((B * H, 5, max(Dk, Dw)), dtype=np.float32)  # scratch vectors: one allocation per call
    for bh in numba.prange(B * H):
        b = bh // H
        h = bh - b * H
        STbh = ST[b, h]
        r, w = work[bh, 0], work[bh, 1]
        qa, ka, ga = work[bh, 2, :Dk], work[bh, 3, :Dk], work[bh, 4, :Dk]
        for t in range(T):
            a = np.float32(1.0)
            if gated and not per_channel:
                a = np.float32(math.exp(g[b, t, h, 0]))
            qk = np.float32(0.0)
            for i in range(Dk):
                qa[i] = q[b, t, h, i]
                ka[i] = k[b, t, h, i]
                qk += qa[i] * ka[i]
            if per_channel:  # diag(a) S: the read becomes S^T (a * q), the gate rides on q
                for i in range(Dk):
                    ga[i] = np.float32(math.exp(g[b, t, h, i]))
                    qa[i] = qa[i] * ga[i]
            else:
                for i in range(Dk):
                    ga[i] = a
            for j in range(Dv):
                w[j] = v[b, t, h, j]
            if normalize:
                w[Dv] = np.float32(1.0)  # z is the memory of a constant value 1
            if delta:
                bt = beta[b, t, h]
                for j in range(Dw):
                    pj = np.float32(0.0)
                    rj = np.float32(0.0)
                    for i in range(Dk):
                        s = STbh[j, i]
                        pj += ka[i] * s
                        rj += qa[i] * s
                    uj = bt * (w[j] - a * pj)
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
            ra = np.float32(1.0) if per_channel else a
            if normalize:
                den = sc * (ra * r[Dv] + qk)
                den = max(den, ep) if clamp else den + ep
                for j in range(Dv):
                    o[b, t, h, j] = sc * (ra * r[j] + qk * w[j]) / den
            else:
                for j in range(Dv):
                    o[b, t, h, j] = sc * (ra * r[j] + qk * w[j])


_FLAGS_T = dict(_FLAGS, fastmath={"contract", "reassoc", "nsz"})  # nsz: a sum starting at +0.0 vectorizes
prefill_parallel = numba.njit(parallel=True, **_FLAGS_T)(_token_loop_t)
prefill_serial = numba.njit(**_FLAGS_T)(_token_loop_t)


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


def run(q, k, v, g, beta, S, o, *, scale: float, eps: float, clamp: bool, normalize: bool,
        transposed: bool = False) -> None:
    """Call the token loop on float32 NumPy views: ``g`` [B, T, H, 1 or Dk] or None, ``beta`` [B, T, H] or None.

    ``S`` [B, H, Dk, Dv(+1)] (``transposed``: [B, H, Dv(+1), Dk], the prefill kernel) is updated in place and
    ``o`` [B, T, H, Dv] written. Threads: torch's count.
    """
    B, T, H, Dk = q.shape
    gated, delta = g is not None, beta is not None
    per_channel = gated and g.shape[3] != 1
    g = _DUMMY4 if g is None else g
    beta = _DUMMY3 if beta is None else beta
    args = (q, k, v, g, beta, S, o, scale, eps, clamp, normalize, gated, delta, per_channel)
    parallel, serial = (prefill_parallel, prefill_serial) if transposed else (token_loop_parallel, token_loop_serial)
    threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    if threads > 1 and B * H > 1 and B * H * T * S.shape[2] * S.shape[3] >= PARALLEL_MIN_WORK:
        with _LOCK:
            numba.set_num_threads(threads)
            parallel(*args)
    else:
        serial(*args)


_DUMMY4 = np.zeros((1, 1, 1, 1), dtype=np.float32)
_DUMMY3 = np.zeros((1, 1, 1), dtype=np.float32)
