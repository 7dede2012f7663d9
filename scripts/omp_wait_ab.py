"""Thread scaling of a compiled prefill that follows a torch operation, with torch's OpenMP threads spinning after
each parallel region (libgomp's default) and with ``OMP_WAIT_POLICY=PASSIVE`` (they sleep at once).

numba's thread pool and torch's OpenMP pool are separate: for a few milliseconds after a parallel torch operation
(an nn layer's projection, say) torch's idle threads spin and take the cores the compiled kernel's threads need.
Each variant runs in its own process (libgomp reads the variable when it loads); the processes alternate for
``--rounds`` rounds and each times 1 and 2 threads side by side, so each 1 -> 2 thread ratio is taken in one run.
Usage, from the repository root:

    python scripts/omp_wait_ab.py [--rounds 3] [--output benchmarks/results/NAME_cpu.txt]

``--output`` writes the table atomically (an existing file only with ``--overwrite``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

VARIANTS = {"default (spin)": None, "OMP_WAIT_POLICY=PASSIVE": "PASSIVE"}  # the variable's value (None: unset)


def child(reps: int) -> None:
    """Median ms of a gated-delta prefill right after a torch matmul (B=1, T=8192, H=8, D=64, l2 features), at 1
    and 2 threads in turns; printed as JSON."""
    import torch

    import linattn

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8192, 8, 64, generator=gen) for _ in range(3))
    g, beta = -torch.rand(1, 8192, 8, generator=gen) * 0.1, torch.rand(1, 8192, 8, generator=gen)
    x, w = torch.randn(2048, 256, generator=gen), torch.randn(256, 256, generator=gen)
    times: dict[int, list[float]] = {1: [], 2: []}
    with torch.no_grad():
        for rep in range(reps + 1):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                x @ w  # a parallel torch operation just before (untimed), as an nn layer's projection
                start = time.perf_counter()
                linattn.linear_attention(q, k, v, rule="gated_delta", feature_map="l2", g=g, beta=beta,
                                         output_final_state=True, backend="cpu")
                if rep:  # the first round compiles and warms up
                    times[threads].append(time.perf_counter() - start)
    print(json.dumps({t: statistics.median(v) * 1e3 for t, v in times.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--output", default=None)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.reps)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_step_ab import emit

    from linattn.tools.harness import machine
    from linattn.tools.harness.results import check_writable

    if args.output:
        check_writable(args.output, overwrite=args.overwrite)  # before minutes of timing, not after
    load = os.getloadavg()[0]
    got: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        for name in list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]:  # the order alternates each round
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if VARIANTS[name] is not None:
                env["OMP_WAIT_POLICY"] = VARIANTS[name]
            out = subprocess.run([sys.executable, __file__, "--child", "--reps", str(args.reps)], check=True,
                                 capture_output=True, text=True, env=env).stdout
            got[name].append(json.loads(out.strip().splitlines()[-1]))
    lines = [f"# omp_wait_ab.py --rounds {args.rounds} --reps {args.reps}",
             f"# {datetime.now(timezone.utc).isoformat(timespec='seconds')}  {machine.processor_name()}, "
             f"{os.cpu_count()} cores, load average before {load:.2f}, after {os.getloadavg()[0]:.2f}",
             "# gated_delta prefill B=1 T=8192 H=8 D=64 (backend='cpu') right after a 2048x256 @ 256x256 matmul; ms",
             "| torch's OpenMP threads | round | 1 thread | 2 threads | 1 -> 2 threads |", "|---|---|---|---|---|"]
    for name, rows in got.items():
        for i, r in enumerate(rows):
            lines.append(f"| {name} | {i + 1} | {r['1']:.1f} | {r['2']:.1f} | {r['1'] / r['2']:.2f}x |")
    emit(lines, args.output, args.overwrite)


if __name__ == "__main__":
    main()
