"""One decode step of the one-call kernel on one thread against two threads, two ways: the Python thread pool
(`cpu_decode.decode_split`) and workers that wait awake for a while after each call (`cpu_decode.decode_handoff`).

First the cost of handing work over at all (a step of a one-entry state, split in two): back to back (the
handoff's worker still awake) and after 2 ms of other work (asleep); then the step at real layer geometries
(B = 1, float32): Mamba-2-2.7B (80 heads, head dim 64, state 128, one group), Qwen3.5's Gated DeltaNet (16 q/k
heads, 32 value heads, 128 x 128), Kimi Linear's KDA (32 heads, 128 x 128, a gate per key channel), and Qwen3.5's
at batch 32 (16.8M entries, the policy's split threshold), each back to back and after 1 ms of other work (as
between the layers of a model). Modes are interleaved, 64 different tokens cycled, medians in microseconds; the
load average is printed with every row.

    PYTHONPATH=src python scripts/decode_split_bench.py --out benchmarks/results/decode_split_handoff_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numba
import torch

from linattn.kernels import cpu_decode
from linattn.tools.harness.results import atomic_write

TOKENS = 64


def processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def geometry(B, Hq, HV, D, Dv, *, gate_width, delta, code, seed=0):
    """Step arguments for each of ``TOKENS`` tokens on one in-place state (kept alive in the closure)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(TOKENS, B, Hq, D, generator=gen), torch.randn(TOKENS, B, Hq, D, generator=gen)
    if not delta:
        k = k / D**0.5
    v = torch.randn(TOKENS, B, HV, Dv, generator=gen)
    g = -torch.rand(TOKENS, B, HV, max(gate_width, 1), generator=gen) * 0.1
    beta = torch.rand(TOKENS, B, HV, generator=gen)
    S = torch.randn(B, HV, D, Dv, generator=gen) * 0.01
    o = torch.empty(B, HV, Dv)
    keep = (q, k, v, g, beta, S, o)
    return [(q[i].data_ptr(), k[i].data_ptr(), v[i].data_ptr(), g[i].data_ptr(), beta[i].data_ptr(), S.data_ptr(),
             S.data_ptr(), o.data_ptr(), B, Hq, HV, D, Dv, gate_width, code, 0, 0, int(delta), D**-0.5, 1e-6)
            for i in range(TOKENS)], keep


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def medians_us(modes: dict, steps, repeats: int, gap: float) -> dict:
    """Median microseconds of each mode over ``repeats`` steps, the modes interleaved, ``gap`` s of other work
    before each step."""
    for fn in modes.values():
        for a in steps[:4]:
            fn(a)
    times = {name: [] for name in modes}
    for r in range(repeats):
        a = steps[r % len(steps)]
        for name, fn in modes.items():
            if gap:
                busy(gap)
            start = time.perf_counter()
            status = fn(a)
            times[name].append(time.perf_counter() - start)
            assert status == cpu_decode.OK
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2, help="every row this many times, to see the spread")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [f"decode step, one thread against two: {processor()} ({os.cpu_count()} cores), numba "
             f"{numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads), torch {torch.__version__}; "
             f"handoff spin {cpu_decode.HANDOFF_SPIN_US:g} us, chunks of {cpu_decode.SPLIT_CHUNK_ENTRIES} entries; "
             f"medians of {args.repeats} interleaved steps (us); load = 1-min load average after the row",
             "serial: cpu_decode.decode; pool: decode_split(2) (Python thread pool); handoff: decode_handoff(2)", ""]

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    modes = {"serial": lambda a: cpu_decode.decode(*a), "pool": lambda a: cpu_decode.decode_split(2, *a),
             "handoff": lambda a: cpu_decode.decode_handoff(2, *a)}
    l2, ident = cpu_decode.FEATURE_CODES["l2"], cpu_decode.FEATURE_CODES["identity"]
    cases = [
        ("handing over (a 2 x 1 x 1 state)", dict(B=1, Hq=2, HV=2, D=1, Dv=1, gate_width=1, delta=1, code=l2)),
        ("Mamba-2-2.7B (80 x 128 x 64, one group)", dict(B=1, Hq=1, HV=80, D=128, Dv=64, gate_width=1, delta=0,
                                                         code=ident)),
        ("Qwen3.5 GDN (16/32 x 128 x 128)", dict(B=1, Hq=16, HV=32, D=128, Dv=128, gate_width=1, delta=1, code=l2)),
        ("Kimi KDA (32 x 128 x 128, per-channel)", dict(B=1, Hq=32, HV=32, D=128, Dv=128, gate_width=128, delta=1,
                                                        code=l2)),
        ("Qwen3.5 GDN, B=32 (16.8M entries)", dict(B=32, Hq=16, HV=32, D=128, Dv=128, gate_width=1, delta=1,
                                                   code=l2)),
    ]
    for _ in range(args.rounds):
        for name, geo in cases:
            steps, keep = geometry(**geo)
            entries = geo["B"] * geo["HV"] * geo["D"] * geo["Dv"]
            reps = args.repeats if entries < 1 << 22 else max(20, args.repeats // 20)
            for label, gap in (("back to back", 0.0), ("after 1 ms of other work", 1e-3)):
                m = medians_us(modes, steps, reps, gap)
                emit(f"{name:42s} {label:26s} serial {m['serial']:9.1f}  pool {m['pool']:9.1f} "
                     f"({m['pool'] / m['serial']:.2f}x)  handoff {m['handoff']:9.1f} "
                     f"({m['handoff'] / m['serial']:.2f}x)  load {os.getloadavg()[0]:.2f}")
            del keep
    if args.out:
        print("wrote", atomic_write(args.out, lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"),
                                    overwrite=args.overwrite))


if __name__ == "__main__":
    main()
