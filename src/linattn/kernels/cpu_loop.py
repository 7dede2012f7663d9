"""The general token loop on the CPU (numba): one fused loop for every rule over [B, T] tokens, on the [Dk, Dw]
state layout (the decode step that the one-call kernel of `linattn.kernels.cpu_decode` does not take).

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

import numba
import numpy as np

from linattn.kernels import cpu_threads

_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


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


token_loop_parallel, token_loop_serial = cpu_threads.builds(_token_loop, _FLAGS)


def run(q, k, v, g, beta, S, o, *, scale: float, eps: float, clamp: bool, normalize: bool, threads: int = 1) -> None:
    """Call the [Dk, Dw]-layout token loop on float32 NumPy views: ``g`` [B, T, H, 1 or Dk] or None, ``beta``
    [B, T, H] or None; ``S`` [B, H, Dk, Dv(+1)] is updated in place and ``o`` [B, T, H, Dv] written (decode), on
    ``threads`` threads (the heads split over them)."""
    B, T, H, Dk = q.shape
    gated, delta = g is not None, beta is not None
    per_channel = gated and g.shape[3] != 1
    g = _DUMMY4 if g is None else g
    beta = _DUMMY3 if beta is None else beta
    args = (q, k, v, g, beta, S, o, scale, eps, clamp, normalize, gated, delta, per_channel)
    cpu_threads.launch(token_loop_parallel, token_loop_serial, args, threads)


_DUMMY4 = np.zeros((1, 1, 1, 1), dtype=np.float32)
_DUMMY3 = np.zeros((1, 1, 1), dtype=np.float32)
