"""A question asked for the rules without a delta: does a compiled chunk kernel (each chunk's C x C
scores and its state update as small matmuls on data kept in L1/L2) beat the compiled token loop?

An experiment, not a backend: the chunk kernel below (numba, its matmuls through numba's ``np.dot``, i.e. BLAS
via SciPy) computes the unnormalized read of accumulate and of gated with one gate per head, checks itself against
the token loop (``cpu_prefill.prefill``) and both are timed side by side, interleaved, at B=1, H=8, D=64 (the
normalized rules' ones column makes Dw = 65). Gates use the exact masked decay exp(G_i - G_j) per chunk (the form
that is safe for every gate, -inf included). The delta rules' chunk form also needs a triangular solve per chunk
and was not written.

    python scripts/chunk_vs_token_loop.py --threads 1 --T 8192
"""

from __future__ import annotations

import argparse
import math
import os

# One BLAS thread (SciPy's OpenBLAS would take every core); set before numpy/scipy load.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import statistics  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from linattn.kernels import cpu_prefill  # noqa: E402


@numba.njit(cache=True, nogil=True, fastmath={"contract"})  # serial: the timing is per thread
def chunk_forward(q, k, v, g, S0, o, C, scale, gated):
    """q, k [T, H, Dk]; v [T, H, Dw]; g [T, H] (read when ``gated``); S0 [H, Dk, Dw] (updated); o [T, H, Dw]."""
    T, H, Dk = q.shape
    Dw = v.shape[2]
    for h in range(H):
        S = S0[h].copy()
        Qc = np.empty((C, Dk), dtype=np.float32)
        Kc = np.empty((C, Dk), dtype=np.float32)
        Kw = np.empty((C, Dk), dtype=np.float32)
        Vc = np.empty((C, Dw), dtype=np.float32)
        G = np.zeros(C, dtype=np.float64)
        for c0 in range(0, T, C):
            n = min(C, T - c0)
            acc = 0.0
            for i in range(n):
                if gated:
                    acc += max(g[c0 + i, h], -1000.0)  # floored, as linattn.ops.common.log_cumsum
                G[i] = acc
                for d in range(Dk):
                    Qc[i, d] = q[c0 + i, h, d]
                    Kc[i, d] = k[c0 + i, h, d]
                for d in range(Dw):
                    Vc[i, d] = v[c0 + i, h, d]
            A = np.dot(Qc[:n], Kc[:n].T)  # [n, n] scores
            for i in range(n):
                for j in range(n):
                    A[i, j] = A[i, j] * np.float32(math.exp(G[i] - G[j])) if j <= i else np.float32(0.0)
            if gated:
                for i in range(n):
                    ei = np.float32(math.exp(G[i]))
                    wi = np.float32(math.exp(G[n - 1] - G[i]))
                    for d in range(Dk):
                        Qc[i, d] *= ei
                        Kw[i, d] = Kc[i, d] * wi
            else:
                Kw[:n] = Kc[:n]
            read = np.dot(A, Vc[:n]) + np.dot(Qc[:n], S)
            decay = np.float32(math.exp(G[n - 1])) if gated else np.float32(1.0)
            S = decay * S + np.dot(Kw[:n].T, Vc[:n])
            for i in range(n):
                for d in range(Dw):
                    o[c0 + i, h, d] = np.float32(scale) * read[i, d]
        S0[h] = S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunks", default="32,64,128")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    T, H, D = args.T, 8, 64
    rng = np.random.default_rng(0)
    q = (np.abs(rng.standard_normal((T, H, D))) + 0.1).astype(np.float32)
    k = (np.abs(rng.standard_normal((T, H, D))) + 0.1).astype(np.float32)
    v = np.concatenate([rng.standard_normal((T, H, D)), np.ones((T, H, 1))], axis=-1).astype(np.float32)
    g = np.log(1 / (1 + np.exp(-(rng.standard_normal((T, H)) + 4)))).astype(np.float32)  # logsigmoid(x + 4)
    cu = np.array([0, T], dtype=np.int64)
    print(f"load {os.getloadavg()[0]:.2f}, threads {args.threads}, H={H} D={D} Dw={D + 1} T={T}, median of "
          f"{args.repeats}, ms")
    for gated in (False, True):

        def loop(gated=gated):
            ST = np.zeros((1, H, D + 1, D), dtype=np.float32)
            o = np.empty((T, H, D + 1), dtype=np.float32)
            cpu_prefill.prefill(q, k, v, g[..., None] if gated else None, None, cu, ST, o, scale=D**-0.5, eps=0.0,
                                clamp=False, normalize=False)
            return o

        def chunk(C, gated=gated):
            S = np.zeros((H, D, D + 1), dtype=np.float32)
            o = np.empty((T, H, D + 1), dtype=np.float32)
            chunk_forward(q, k, v, g, S, o, C, D**-0.5, gated)
            return o

        ref = loop()
        fns = {"token loop": loop}
        for C in map(int, args.chunks.split(",")):
            out = chunk(C)
            err = float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))
            assert err < 1e-4, f"chunk kernel C={C} differs from the token loop by {err:.2e}"
            fns[f"chunk C={C}"] = lambda C=C: chunk(C)
        times = {name: ([], []) for name in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                start, cpu = time.perf_counter(), time.process_time()
                fn()
                times[name][0].append(time.perf_counter() - start)
                times[name][1].append(time.process_time() - cpu)
        rule = "gated (per head)" if gated else "accumulate"
        print(rule + " (wall / CPU ms): " + ", ".join(
            f"{n} {statistics.median(w) * 1e3:.1f} / {statistics.median(c) * 1e3:.1f}" for n, (w, c) in times.items()))
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
