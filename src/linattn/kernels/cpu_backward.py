"""The prefill's backward on the CPU (numba): a reverse-time token loop that recomputes each segment's states from
the checkpoints `linattn.kernels.cpu_prefill` kept, its (sequence, head) pairs split with ``prange`` (a small job
runs the serial build of the same function).

Compiled on first use for each dtype and cached on disk (``cache=True``: next to this file, or in numba's user
cache directory when that is read-only, or ``NUMBA_CACHE_DIR``), so later processes load machine code.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from linattn.kernels import cpu_threads
from linattn.kernels.cpu_intrinsics import checkpoint_starts

# nsz: a sum starting at +0.0 vectorizes
_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract", "reassoc", "nsz"})


def _backward(q, k, v, g, beta, cu, ckpt, ck_start, every, dST, do, dq, dk, dv, dg, dbeta, scale, gated, delta,
              per_channel):
    """Gradients of the prefill kernel (`linattn.kernels.cpu_prefill`), unnormalized, ``group`` 1: q, k [T, H, Dk],
    v and do [T, H, Dw].

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


backward_parallel, backward_serial = cpu_threads.builds(_backward, _FLAGS)


def backward(q, k, v, g, beta, cu, ckpt, dST, do, dq, dk, dv, dg, dbeta, *, scale: float, every: int,
             threads: int = 1) -> None:
    """Gradients of an unnormalized `linattn.kernels.cpu_prefill.prefill` run (q, k at the value heads), written
    into ``dq, dk, dv`` (the shapes of q, k, v), ``dg`` (g's, or None without a gate) and ``dbeta`` ([T, H], or None
    without beta); ``dST`` goes in as the final states' gradient and comes out as the initial states'."""
    gated, delta = g is not None, beta is not None
    per_channel = gated and g.shape[2] != 1
    dg = _DUMMY3 if dg is None else dg
    dbeta = _DUMMY2 if dbeta is None else dbeta
    ck_start, _ = checkpoint_starts(cu, every)
    args = (q, k, v, _DUMMY3 if g is None else g, _DUMMY2 if beta is None else beta, cu, ckpt, ck_start, every,
            dST, do, dq, dk, dv, dg, dbeta, scale, gated, delta, per_channel)
    cpu_threads.launch(backward_parallel, backward_serial, args, threads)


_DUMMY3 = np.zeros((1, 1, 1), dtype=np.float32)
_DUMMY2 = np.zeros((1, 1), dtype=np.float32)
