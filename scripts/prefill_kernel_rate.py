"""The compiled prefill token loop's arithmetic rate against the machine's float32 matmul rate, per thread count.

The token loop touches every state entry once per token: the gated rule does 5 flops per entry (decay, the
rank-1 write, the read: one multiply, two fused multiply-adds), the gated delta rule 7 (its prediction for the next
token too). Rate = entries x flops / time, at Mamba-2-2.7B's layer (80 heads, state 128 x 64, one group) and
Qwen3.5's Gated DeltaNet (32 value heads on 16 q/k heads, 128 x 128), T = ``--T``, B = 1, float32, outside autograd
(``backend="cpu"``); the matmul is ``torch.mm`` of two ``--n`` x ``--n`` float32 matrices. Medians, interleaved.

    PYTHONPATH=src python scripts/prefill_kernel_rate.py --out benchmarks/results/prefill_kernel_rate_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numba
import torch
import torch.nn.functional as F

import linattn


def processor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown processor"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    T, gen = args.T, torch.Generator().manual_seed(0)
    # Mamba-2: q = C, k = B (one group), v = dt x, g = dt A
    mC, mB = (torch.randn(1, T, 1, 128, generator=gen) for _ in range(2))
    mv = torch.randn(1, T, 80, 64, generator=gen)
    mg = -torch.rand(1, T, 80, generator=gen)
    q, k = (F.normalize(torch.randn(1, T, 16, 128, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(1, T, 32, 128, generator=gen)
    g = -F.softplus(torch.randn(1, T, 32, generator=gen)) * 0.1
    beta = torch.rand(1, T, 32, generator=gen)
    a, b = (torch.randn(args.n, args.n, generator=gen) for _ in range(2))
    cases = {
        "mamba2 token loop (gated)": (lambda: linattn.linear_attention(
            mC, mB, mv, rule="gated", g=mg, normalize=False, scale=1.0, backend="cpu"), T * 80 * 128 * 64 * 5),
        "gated delta token loop": (lambda: linattn.linear_attention(
            q, k, v, rule="gated_delta", g=g, beta=beta, backend="cpu"), T * 32 * 128 * 128 * 7),
        f"torch.mm {args.n}^3": (lambda: torch.mm(a, b), 2 * args.n ** 3),
    }
    lines = [f"Compiled prefill token loop vs float32 matmul, {processor()}, {os.cpu_count()} cores shared with "
             f"other jobs, T = {T}, B = 1; medians of {args.repeats} interleaved runs.", "",
             f"{'threads':>7}  {'case':28s} {'ms':>9} {'GFLOP/s':>8}  load"]
    with torch.no_grad():
        for threads in args.threads:
            torch.set_num_threads(threads)
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            for fn, _ in cases.values():
                fn()
            samples = {name: [] for name in cases}
            for _ in range(args.repeats):
                for name, (fn, _) in cases.items():
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - t0)
            load = os.getloadavg()[0]
            for name, (_, flops) in cases.items():
                sec = statistics.median(samples[name])
                lines.append(f"{threads:>7}  {name:28s} {sec * 1e3:9.1f} {flops / sec / 1e9:8.1f}  {load:.1f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from linattn.tools.harness.results import atomic_write

        atomic_write(args.out, lambda p: p.write_text(text, encoding="utf-8"), overwrite=args.overwrite)


if __name__ == "__main__":
    main()
