"""One decode step with its state cold in the cache (as in a model, where every other layer's weights pass through
the cache between two steps of one layer): the serial one-call kernel against its split over 2 threads, at real
layer geometries, alternating in one process.

Between two timed steps a 64 MiB buffer is written, evicting the state. Prints medians (µs) of both and their
ratio, with the load average.

    PYTHONPATH=src python scripts/decode_split_cold.py [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

import linattn
from linattn.backends import policy
from linattn.state import State

GEOMETRIES = {  # name: (q/k heads, value heads, key width, value width, rule, gate per key channel)
    "Qwen3.5 gated delta (16 q/k, 32 value heads, 128 x 128)": (16, 32, 128, 128, "gated_delta", False),
    "Kimi Linear KDA (32 heads, 128 x 128, gate per channel)": (32, 32, 128, 128, "gated_delta", True),
    "Mamba-2-2.7B (1 group, 80 heads, state 128, head dim 64)": (1, 80, 128, 64, "gated", False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    flush = torch.empty(16 << 20)
    lines = [f"decode step, state cold (64 MiB written between steps); {platform.processor() or 'AMD EPYC'}, "
             f"{os.cpu_count()} cores, torch threads 2; medians of {args.rounds} alternating steps, us; "
             f"load average before {os.getloadavg()[0]:.2f}"]
    for name, (Hq, HV, D, Dv, rule, per_channel) in GEOMETRIES.items():
        g0 = torch.Generator().manual_seed(0)
        q, k = torch.randn(1, Hq, D, generator=g0), torch.randn(1, Hq, D, generator=g0)
        k = torch.nn.functional.normalize(k, dim=-1)
        v = torch.randn(1, HV, Dv, generator=g0)
        g = -torch.rand(*((1, HV, D) if per_channel else (1, HV)), generator=g0) * 0.1
        beta = torch.rand(1, HV, generator=g0) if rule == "gated_delta" else None
        state = State.zeros(1, HV, D, Dv, normalizer=False)
        dec = linattn.Decoder(state, rule=rule, normalize=False, scale=1.0)
        times = {"serial": [], "split": []}
        for r in range(args.rounds + 10):
            for mode in ("serial", "split"):
                policy.DECODE_SPLIT_MIN_ENTRIES = (1 << 62) if mode == "serial" else 0
                flush.fill_(r)
                t0 = time.perf_counter()
                dec(q, k, v, g=g, beta=beta)
                if r >= 10:
                    times[mode].append(time.perf_counter() - t0)
        s, p = (statistics.median(times[m]) * 1e6 for m in ("serial", "split"))
        lines.append(f"{name:58s} serial {s:8.1f}  split {p:8.1f}  split/serial {p / s:5.2f}  "
                     f"load {os.getloadavg()[0]:.2f}")
        print(lines[-1], flush=True)
    policy.DECODE_SPLIT_MIN_ENTRIES = 1 << 24
    if args.out:
        from linattn.tools.harness.results import atomic_write
        atomic_write(args.out, lambda p: p.write_text("\n".join(lines) + "\n"), overwrite=True)


if __name__ == "__main__":
    main()
