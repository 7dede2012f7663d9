"""The decode step's serial one-call kernel against its parallel build (heads split over threads), by state size:
where splitting pays, for ``linattn.backends.policy.DECODE_SPLIT_MIN_ENTRIES``.

In-place gated-delta ``linattn.step`` from ``State.zeros``: H = 8, D = 64 and the Qwen3-Next geometry (16 q/k
heads, 32 value heads, D = 128) at several batch sizes. Three ways in alternating blocks (7 rounds, minimum of each):
1 thread, 2 threads with the serial kernel, 2 threads with the heads split. Microseconds per step.

Usage, from the repository root: ``PYTHONPATH=src python scripts/decode_split_ab.py``
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

import linattn
from linattn.backends import policy

CASES = {"h8 B1": (1, 8, 8, 64), "h8 B32": (32, 8, 8, 64), "h8 B128": (128, 8, 8, 64), "h8 B256": (256, 8, 8, 64),
         "qwen3_next B1": (1, 16, 32, 128), "qwen3_next B4": (4, 16, 32, 128), "qwen3_next B8": (8, 16, 32, 128),
         "qwen3_next B16": (16, 16, 32, 128), "qwen3_next B32": (32, 16, 32, 128)}


def step_fn(B, Hq, H, D):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, D, generator=gen)
    k = F.normalize(torch.randn(B, Hq, D, generator=gen), dim=-1)
    v = torch.randn(B, H, D, generator=gen)
    g, beta = F.logsigmoid(torch.randn(B, H, generator=gen) + 3), torch.rand(B, H, generator=gen)
    state = linattn.State.zeros(B, H, D, D, normalizer=False)
    return lambda: linattn.step(q, k, v, state, rule="gated_delta", g=g, beta=beta, inplace=True)


def main() -> None:
    threads_before, bar = torch.get_num_threads(), policy.DECODE_SPLIT_MIN_ENTRIES
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  nproc {os.cpu_count()}  "
          f"load average before {os.getloadavg()[0]:.2f}; microseconds per step, minimum of 7 alternating blocks")
    try:
        for name, (B, Hq, H, D) in CASES.items():
            step = step_fn(B, Hq, H, D)
            calls = max(3, min(300, int(3e7 // (B * H * D * D * 4))))
            res = {"1 thread": [], "2 threads serial": [], "2 threads split": []}
            for _ in range(7):
                for way in res:
                    torch.set_num_threads(1 if way == "1 thread" else 2)
                    policy.DECODE_SPLIT_MIN_ENTRIES = 0 if way.endswith("split") else 1 << 62
                    step()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        step()
                    res[way].append((time.perf_counter() - t0) / calls * 1e6)
            best = {way: min(ts) for way, ts in res.items()}
            print(f"{name:15s} state entries {B * H * D * D:>9d}  "
                  + "  ".join(f"{way} {t:8.1f}" for way, t in best.items())
                  + f"  split/serial {best['2 threads split'] / best['2 threads serial']:.2f}")
    finally:
        torch.set_num_threads(threads_before)
        policy.DECODE_SPLIT_MIN_ENTRIES = bar
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
