#!/usr/bin/env python3
"""lab.py: the linattn mechanism checks with nothing but NumPy (download it from the explainer page).

    python3 lab.py            # PASS/FAIL lines, exit status 1 if any check fails
    python3 lab.py --seed 7   # other random inputs
    python3 lab.py --chunk-size 3   # the chunk check with one chunk size (default: several)

Each line reads ``name: PASS|FAIL  max_err=E tol=T`` like ``linattn lab``, whose checks of the same names run the
library's torch forms; here every form is written out in a few lines of NumPy on one head, in float64.
The mechanism is explained in the linattn repository, docs/mechanism.md.
"""

from __future__ import annotations

import argparse
import sys
import zlib

import numpy as np

TOL = 1e-10
CHUNK_SIZES = (1, 4, 5, 13)  # the chunk check's sizes unless --chunk-size names one


def recurrent(q, k, v, rule="accumulate", alpha=None, beta=None, normalize=None, eps=0.0, eps_mode="add", S0=None,
              z0=None):
    """The defining token loop on one head: features q, k [T, r], values v [T, dv]; returns y [T, dv], S, z.

    accumulate: S = S + k v^T, z = z + k;  gated: S = a S + k v^T, z = a z + k;
    delta: S = S + k (beta (v - S^T k))^T;  gated_delta: S = a S first.  Written first, then read: y = S^T q,
    divided by q.z + eps ("add") or max(q.z, eps) ("clamp") when normalized (accumulate and gated only).
    """
    T, r = k.shape
    dv = v.shape[1]
    normalize = rule in ("accumulate", "gated") if normalize is None else normalize
    S = np.zeros((r, dv)) if S0 is None else np.array(S0, dtype=np.float64)
    z = (np.zeros(r) if z0 is None else np.array(z0, dtype=np.float64)) if normalize else None
    y = np.zeros((T, dv))
    for t in range(T):
        if rule in ("gated", "gated_delta"):
            S = alpha[t] * S
            z = None if z is None else alpha[t] * z
        if rule in ("delta", "gated_delta"):
            S = S + np.outer(k[t], beta[t] * (v[t] - S.T @ k[t]))
        else:
            S = S + np.outer(k[t], v[t])
            z = None if z is None else z + k[t]
        num = S.T @ q[t]
        y[t] = num if z is None else num / ((q[t] @ z + eps) if eps_mode == "add" else max(q[t] @ z, eps))
    return y, S, z


def decay_matrix(alpha):
    """D[t, i] = alpha_{i+1} ... alpha_t for i <= t (the weight of token i at time t), 0 above the diagonal."""
    T = len(alpha)
    D = np.zeros((T, T))
    for t in range(T):
        for i in range(t + 1):
            D[t, i] = np.prod(alpha[i + 1 : t + 1])
    return D


def dense(q, k, v, alpha=None):
    """The whole sequence at once: A = (Q K^T) * D, y = A V / rowsum(A)."""
    D = np.tril(np.ones((len(k), len(k)))) if alpha is None else decay_matrix(alpha)
    A = (q @ k.T) * D
    return (A @ v) / A.sum(axis=1, keepdims=True)


def chunkwise(q, k, v, size, alpha=None):
    """Chunks of `size` tokens: read the carried (S, z) plus the chunk's own masked block, then hand the state on."""
    alpha = np.ones(len(k)) if alpha is None else np.asarray(alpha)
    S, z = np.zeros((k.shape[1], v.shape[1])), np.zeros(k.shape[1])
    out = []
    for s in range(0, len(k), size):
        Q, K, V, a = q[s : s + size], k[s : s + size], v[s : s + size], alpha[s : s + size]
        into = np.cumprod(a)  # decay from the chunk's start to each token
        A = (Q @ K.T) * decay_matrix(a)
        num = into[:, None] * (Q @ S) + A @ V
        den = into * (Q @ z) + A.sum(axis=1)
        out.append(num / den[:, None])
        tail = decay_matrix(a)[-1]  # decay from each token to the chunk's end
        S = into[-1] * S + K.T @ (tail[:, None] * V)
        z = into[-1] * z + K.T @ tail
    return np.concatenate(out)


def max_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def rng_for(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def features(rng, T, r):
    return np.maximum(rng.standard_normal((T, r)), 0.0) + 1.0  # relu + 1: positive features


def check_dense(rng):
    T, r, dv = 11, 4, 3
    q, k, v = features(rng, T, r), features(rng, T, r), rng.standard_normal((T, dv))
    alpha = rng.uniform(0.3, 1.0, T)
    return max(max_err(dense(q, k, v), recurrent(q, k, v)[0]),
               max_err(dense(q, k, v, alpha), recurrent(q, k, v, "gated", alpha=alpha)[0]))


def check_chunks(rng, sizes=CHUNK_SIZES):
    T, r, dv = 13, 3, 2
    q, k, v = features(rng, T, r), features(rng, T, r), rng.standard_normal((T, dv))
    alpha = rng.uniform(0.3, 1.0, T)
    errs = [max_err(chunkwise(q, k, v, c), recurrent(q, k, v)[0]) for c in sizes]
    errs += [max_err(chunkwise(q, k, v, c, alpha), recurrent(q, k, v, "gated", alpha=alpha)[0]) for c in sizes]
    return max(errs)


def check_scan(rng):
    """Compose the per-token maps S -> a S + B as a tree; its result and the closed form match the loop."""
    T, r, dv = 8, 3, 2
    k, v = features(rng, T, r), rng.standard_normal((T, dv))
    alpha = rng.uniform(0.1, 1.0, T)
    maps = [(alpha[t], np.outer(k[t], v[t])) for t in range(T)]
    while len(maps) > 1:  # (a2, B2) o (a1, B1) = (a2 a1, a2 B1 + B2), pairwise: log2(T) levels (T = 8)
        maps = [(maps[i + 1][0] * maps[i][0], maps[i + 1][0] * maps[i][1] + maps[i + 1][1])
                for i in range(0, len(maps), 2)]
    coeff = decay_matrix(alpha)[-1]  # token i's weight at the end: the product of the gates after it
    closed = sum(coeff[i] * np.outer(k[i], v[i]) for i in range(T))
    loop = recurrent(k, k, v, "gated", alpha=alpha, normalize=False)[1]
    return max(max_err(maps[0][1], loop), max_err(closed, loop), abs(maps[0][0] - np.prod(alpha)))


def check_delta_convergence(rng):
    """Unit key, repeated writes: the error shrinks by (1 - beta) per write, exactly."""
    r, n = 5, 6
    key = rng.standard_normal(r)
    key /= np.linalg.norm(key)
    worst = 0.0
    for beta in rng.uniform(0.05, 1.95, 4):
        S0, target = rng.standard_normal((r, 2)), rng.standard_normal(2)
        err0 = target - S0.T @ key
        for m in range(1, n + 1):
            S = recurrent(np.tile(key, (m, 1)), np.tile(key, (m, 1)), np.tile(target, (m, 1)), "delta",
                          beta=[beta] * m, S0=S0)[1]
            worst = max(worst, max_err(target - S.T @ key, (1 - beta) ** m * err0))
    return worst


def check_delta_diverges(rng):
    """beta |k|^2 = 2.5: each write multiplies the error by -1.5, so it grows; returns 0 when it does."""
    key = np.array([1.0, 0.0])
    S = recurrent(np.tile(key, (10, 1)), np.tile(key, (10, 1)), np.full((10, 1), 5.0), "delta", beta=[2.5] * 10,
                  S0=[[2.0], [0.0]])[1]
    return max_err(abs(5.0 - S[0, 0]), 3.0 * 1.5**10)


def check_repeated(rng):
    r = 3
    key, q, value = features(rng, 1, r)[0], features(rng, 1, r)[0], rng.standard_normal(2)
    errs = []
    for m in (1, 5, 50):
        y = recurrent(np.tile(q, (m, 1)), np.tile(key, (m, 1)), np.tile(value, (m, 1)))[0][-1]
        raw = recurrent(np.tile(q, (m, 1)), np.tile(key, (m, 1)), np.tile(value, (m, 1)), normalize=False)[0][-1]
        errs += [max_err(y, value), max_err(raw, m * (q @ key) * value)]
    return max(errs)


def check_segments(rng):
    """Gated delta over a segment maps its incoming state affinely: S_out = P S_in + Q."""
    T, r, dv = 7, 3, 2
    k = rng.standard_normal((T, r))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v, alpha, beta = rng.standard_normal((T, dv)), rng.uniform(0.5, 1.0, T), rng.uniform(0.1, 0.9, T)
    P = np.eye(r)
    for t in range(T):
        P = alpha[t] * (np.eye(r) - beta[t] * np.outer(k[t], k[t])) @ P
    Q = recurrent(k, k, v, "gated_delta", alpha=alpha, beta=beta)[1]
    S_in = rng.standard_normal((r, dv))
    S_out = recurrent(k, k, v, "gated_delta", alpha=alpha, beta=beta, S0=S_in)[1]
    return max_err(P @ S_in + Q, S_out)


def check_worked_kernel(rng):
    """docs/mechanism.md §1: phi(k) = [1,0], [0,1], [1,1]; v = 2, 4, 3; phi(q) = [2, 1] reads 17/6."""
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    return abs(recurrent(np.tile([2.0, 1.0], (3, 1)), k, np.array([[2.0], [4.0], [3.0]]))[0][-1, 0] - 17 / 6)


def check_worked_gate(rng):
    """docs/mechanism.md §2: features 1, v = 2, 4, 8, alpha = 0.5: S = 10.5 at the end, y = 2, 10/3, 6."""
    ones = np.ones((3, 1))
    y, S, z = recurrent(ones, ones, np.array([[2.0], [4.0], [8.0]]), "gated", alpha=[0.5] * 3)
    return max(max_err(y[:, 0], [2, 10 / 3, 6]), abs(S[0, 0] - 10.5), abs(z[0] - 1.75))


def check_worked_delta(rng):
    """docs/mechanism.md §3: unit key, v = 5, beta = 0.5, S starting at 2: S = 3.5, 4.25, 4.625."""
    ones = np.ones((3, 1))
    S = [recurrent(ones[:m], ones[:m], np.full((m, 1), 5.0), "delta", beta=[0.5] * m, S0=[[2.0]])[1][0, 0]
         for m in (1, 2, 3)]
    return max_err(S, [3.5, 4.25, 4.625])


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def softmax_contrast(seed):
    """ELU+1 linear attention against causal softmax attention on the same q, k, v: the largest output gap."""
    rng = rng_for(seed, "softmax contrast")
    T, d = 12, 4
    q, k, v = rng.standard_normal((T, d)), rng.standard_normal((T, d)), rng.standard_normal((T, 2))
    linear = recurrent(elu1(q), elu1(k), v)[0]
    logits = q @ k.T / np.sqrt(d) + np.where(np.tri(T) > 0, 0.0, -np.inf)
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    soft = (w / w.sum(axis=1, keepdims=True)) @ v
    return float(np.max(np.abs(linear - soft)))


CHECKS = [
    ("recurrent vs dense kernel", check_dense),
    ("recurrent vs chunkwise", check_chunks),
    ("gated scan coefficients", check_scan),
    ("delta unit-key convergence", check_delta_convergence),
    ("delta overshoot diverges", check_delta_diverges),
    ("normalizer keeps repeated value", check_repeated),
    ("segment state composes affinely", check_segments),
    ("worked example: kernel (mechanism §1)", check_worked_kernel),
    ("worked example: gate (mechanism §2)", check_worked_gate),
    ("worked example: delta (mechanism §3)", check_worked_delta),
]


def whole_number(least):
    """An argparse type: an integer >= least, refused with a one-line message otherwise (Python 3.9+)."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {n}")
        return n
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=whole_number(0), default=0, help="seed of the random inputs, >= 0 (default 0)")
    parser.add_argument("--chunk-size", type=whole_number(1), default=None, metavar="N",
                        help=f"chunk size of the chunk check (default: each of {', '.join(map(str, CHUNK_SIZES))})")
    args = parser.parse_args(argv)
    seed, sizes = args.seed, CHUNK_SIZES if args.chunk_size is None else (args.chunk_size,)
    failed = 0
    for name, check in CHECKS:
        try:
            err = check(rng_for(seed, name), sizes) if check is check_chunks else check(rng_for(seed, name))
        except Exception as exc:  # a broken check is a FAIL line, never a traceback that hides the others
            err, detail = float("nan"), f"    raised {type(exc).__name__}: {exc}"
        else:
            detail = ""
        ok = err <= TOL  # NaN fails
        failed += not ok
        print(f"{name}: {'PASS' if ok else 'FAIL'}  max_err={err:.2e} tol={TOL:.0e}")
        if detail:
            print(detail)
    print(f"{len(CHECKS) - failed} of {len(CHECKS)} checks passed (seed {seed}, chunk sizes "
          f"{', '.join(map(str, sizes))})")
    gap = softmax_contrast(seed)
    print(f"contrast, not a check: ELU+1 linear attention vs causal softmax on the same q, k, v differ by up to "
          f"{gap:.3f}. Expected: phi(q).phi(k) with a finite feature map is a different similarity from "
          f"exp(q.k / sqrt(d)); the rewrite is exact for its own kernel, it does not reproduce softmax.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
