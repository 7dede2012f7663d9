"""What packing costs: one ``cu_seqlens`` call against a Python loop of separate calls and against one unpacked
call over the same T tokens (a floor: it mixes the sequences), gated delta chunk form, H=8, D=64, float32; the
torch path (``backend="torch"``: padded segments) and the compiled kernel (``backend="cpu"``: packed rows as they
lie, one state per sequence) side by side.

    python scripts/packing_cost.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import linattn
from linattn.packing import plan_segment

MIXES = {
    "similar": [900, 1000, 1100, 1024, 980, 1050, 1000, 1070],
    "skewed": [4096] + [128] * 7,
    "mixed": [256, 2048, 512, 1024, 128, 1536, 768, 1920],
}


def measure(lengths: list[int], repeats: int) -> list[float]:
    """Median ms of (packed, separate calls, one unpacked call) on the torch path, then (packed, unpacked) compiled;
    interleaved so load changes fall on all alike."""
    H, D = 8, 64
    kw = dict(rule="gated_delta", feature_map="l2")
    T = sum(lengths)
    cu = torch.tensor([0] + lengths).cumsum(0)
    q, k, v = (torch.randn(1, T, H, D) for _ in range(3))
    g, beta = -torch.rand(1, T, H) * 0.1, torch.rand(1, T, H)

    def packed(backend):
        linattn.linear_attention(q, k, v, g=g, beta=beta, cu_seqlens=cu, backend=backend, **kw)

    def separate():
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            linattn.linear_attention(q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                                     backend="torch", **kw)

    def unpacked(backend):
        linattn.linear_attention(q, k, v, g=g, beta=beta, backend=backend, **kw)

    fns = [lambda: packed("torch"), separate, lambda: unpacked("torch"), lambda: packed("cpu"),
           lambda: unpacked("cpu")]
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(s) * 1e3 for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name, lengths in MIXES.items():
        ms = measure(lengths, args.repeats)
        seg = plan_segment(torch.tensor(lengths), 64)
        print(f"{name:8s} T={sum(lengths):5d} segment {seg:5d}: torch: packed {ms[0]:7.1f} ms, separate calls "
              f"{ms[1]:7.1f} ms, one unpacked call {ms[2]:7.1f} ms (packed / unpacked {ms[0] / ms[2]:.2f}x); "
              f"compiled: packed {ms[3]:6.1f} ms, unpacked {ms[4]:6.1f} ms (torch packed / compiled packed "
              f"{ms[0] / ms[3]:.1f}x)")

if __name__ == "__main__":
    main()
