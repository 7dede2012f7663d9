"""What a fresh output buffer costs: writing a reused buffer, a fresh one from torch's allocator, and a fresh one
from ``linattn.buffers.empty`` (advised onto huge pages from ``buffers.MIN_BYTES``), at 16 and 64 MiB, 1 thread.
Median milliseconds of 9 calls, the three ways alternating.

Usage, from the repository root: ``PYTHONPATH=src python scripts/buffers_cost.py``
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from linattn import buffers


def main() -> None:
    torch.set_num_threads(1)
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  nproc {os.cpu_count()}  "
          f"load average {os.getloadavg()[0]:.2f}; buffers.MIN_BYTES = {buffers.MIN_BYTES >> 20} MiB")
    for mib in (16, 64):
        n = (mib << 20) // 4
        reused = torch.empty(n)
        ways = {"reused": lambda r=reused: r.fill_(1.0), "torch.empty": lambda n=n: torch.empty(n).fill_(1.0),
                "buffers.empty": lambda n=n: buffers.empty((n,)).fill_(1.0)}
        times = {w: [] for w in ways}
        for _ in range(9):
            for w, fn in ways.items():
                t0 = time.perf_counter()
                fn()
                times[w].append((time.perf_counter() - t0) * 1e3)
        cells = "  ".join(f"{w} {statistics.median(t):6.1f} ms" for w, t in times.items())
        print(f"{mib:3d} MiB written once: {cells}")


if __name__ == "__main__":
    main()
