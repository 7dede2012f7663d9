"""How far a chunk form could take the CPU prefill: its ceiling as a fraction of the matmul rate, measured.

A chunk form does the token loop's state work as matmuls (for the delta rules W S, Q S and K^T V' per chunk of C
tokens: the 6 Dk Dv flops per token and head that the benchmark counts; for accumulate and gated Q S and K^T V,
4 Dk Dv) plus work inside each chunk that the count leaves out. Counting only the lower triangles:

    delta rules:         K K^T and Q K^T (C Dk each), the unit-triangular solve for [U | W] (C (Dk + Dv)),
                         P V' (C Dv): C (3 Dk + 2 Dv) per token and head
    accumulate, gated:   Q K^T (C Dk) and P V (C Dv): C (Dk + Dv)

So even if every flop ran at the rate of the state products themselves (batched over the heads, timed here as
``torch.bmm`` of [H, C, Dk] x [H, Dk, Dv]), the form would reach at most

    ceiling = (that bmm rate / the 1024 x 1024 matmul rate) / (1 + extra / counted)

of the matmul rate by the benchmark's count; gating, exponentials and the smaller C x C products only lower it.
Beside each ceiling the script times the token loop ("auto", float32, nonzero initial state) and the torch chunk
form (``backend="torch"``) on the same inputs, each right after its own matmul measurement, in three rounds at 1
then 2 threads; every fraction is the median of the per-round ratios.

Usage, from the repository root (about a minute on a 2-core AMD EPYC; it prints, and
``scripts/regenerate_results.sh`` writes the committed file):

    PYTHONPATH=src python scripts/chunk_ceiling.py
"""

from __future__ import annotations

import os
import statistics
import time
from functools import partial

import torch
from cpu_kernels_bench import best, matmul_rate, prefill_inputs, processor

import linattn

CASES = {  # (rule, geometry): T, q/k heads, value heads, width
    ("gated_delta", "qwen3_next"): dict(T=4096, Hq=16, H=32, D=128),
    ("gated_delta", "h8"): dict(T=8192, Hq=8, H=8, D=64),
    ("accumulate", "h8"): dict(T=8192, Hq=8, H=8, D=64),
}
CHUNKS = (16, 32, 64)
ROUNDS = 3


def counted(rule: str, D: int) -> int:
    return (6 if "delta" in rule else 4) * D * D


def extra(rule: str, C: int, D: int) -> int:
    return C * (3 * D + 2 * D) if "delta" in rule else C * (D + D)  # C (3 Dk + 2 Dv), C (Dk + Dv) at Dk = Dv = D


def bmm_rate(H: int, C: int, D: int) -> float:
    a, b = torch.randn(H, C, D), torch.randn(H, D, D)
    reps = max(1, int(2e8 // (2 * H * C * D * D)))

    def many():
        for _ in range(reps):
            torch.bmm(a, b)

    return 2 * H * C * D * D * reps / best(many, 7, 2)[0] / 1e9


def main() -> None:
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  processor {processor()}  torch "
          f"{torch.__version__}  load average {tuple(round(x, 2) for x in os.getloadavg())}")
    for (rule, geo), shape in CASES.items():
        q, k, v, kw = prefill_inputs(rule, dtype=torch.float32, **shape)
        flops = counted(rule, shape["D"]) * shape["T"] * shape["H"]
        call = partial(linattn.linear_attention, q, k, v, output_final_state=True, **kw)
        for n in (1, 2):
            torch.set_num_threads(n)
            frac = {"token loop": [], "torch chunk form": [], **{C: [] for C in CHUNKS}}
            ms = {"token loop": [], "torch chunk form": []}
            for r in range(ROUNDS):
                for name, backend in (("token loop", "auto"), ("torch chunk form", "torch")):
                    mm = matmul_rate()
                    t = best(partial(call, backend=backend), 1, 1 if r == 0 else 0)[0]
                    ms[name].append(t * 1e3)
                    frac[name].append(flops / t / 1e9 / mm)
                for C in CHUNKS:
                    mm = matmul_rate()
                    frac[C].append(bmm_rate(shape["H"], C, shape["D"]) / mm)
            cells = [f"{name} {min(ms[name]):.0f} ms = {statistics.median(frac[name]):.2f}"
                     for name in ("token loop", "torch chunk form")]
            for C in CHUNKS:
                mult = 1 + extra(rule, C, shape["D"]) / counted(rule, shape["D"])
                r = statistics.median(frac[C])
                cells.append(f"C={C}: bmm {r:.2f} / {mult:.2f} = ceiling {r / mult:.2f}")
            print(f"{rule} {geo} {shape}, {n} thread(s), of the matmul rate: " + "; ".join(cells), flush=True)
    print(f"# load average after {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
