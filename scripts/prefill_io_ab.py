"""Whole prefill calls of two source trees side by side, for what surrounds the kernel: the output's memory and
bfloat16 inputs. Gated delta, B = 1, a nonzero initial state, the final state returned, ``backend="auto"``;
T = 8192, H = 8, D = 64 and the Qwen3-Next geometry (T = 4096, 16 q/k heads, 32 value heads, D = 128), float32 and
bfloat16 inputs, at 1 and 2 threads.

    mkdir -p /tmp/linattn-base && git archive <base> src | tar -x -C /tmp/linattn-base
    python scripts/prefill_io_ab.py /tmp/linattn-base/src src

Each child process imports one tree and prints the median of 5 calls (after 2 warm-ups) per case; three rounds
alternate the trees, and the median round is printed with this/base.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r'''
import sys, time, json, statistics, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import linattn
torch.set_num_threads(int(sys.argv[2]))
out = {}
for geo, (T, Hq, H, D) in {"h8": (8192, 8, 8, 64), "qwen3_next": (4096, 16, 32, 128)}.items():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, T, Hq, D, generator=gen)
    k = F.normalize(torch.randn(1, T, Hq, D, generator=gen), dim=-1)
    v = torch.randn(1, T, H, D, generator=gen)
    g, beta = F.logsigmoid(torch.randn(1, T, H, generator=gen) + 3), torch.rand(1, T, H, generator=gen)
    state = linattn.State(torch.randn(1, H, D, D, generator=gen) * 0.1, None)
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
        f = lambda: linattn.linear_attention(qd, kd, vd, rule="gated_delta", g=g, beta=beta, initial_state=state,
                                             output_final_state=True)
        f(); f()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1e3)
        out[f"{geo} {str(dtype)[6:]}"] = statistics.median(ts)
print(json.dumps(out))
'''


def main() -> None:
    trees = {"base": sys.argv[1], "this": sys.argv[2]}  # src/ folders
    print(f"# python scripts/prefill_io_ab.py {sys.argv[1]} {sys.argv[2]}")
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  nproc {os.cpu_count()}  "
          f"load average before {os.getloadavg()[0]:.2f}")
    for threads in (1, 2):
        res = {n: [] for n in trees}
        for _round in range(3):
            for n, src in trees.items():
                p = subprocess.run([sys.executable, "-c", CHILD, src, str(threads)], capture_output=True, text=True,
                                   check=True)
                res[n].append(json.loads(p.stdout.strip().splitlines()[-1]))
        for case in res["base"][0]:
            b = statistics.median(x[case] for x in res["base"])
            t = statistics.median(x[case] for x in res["this"])
            print(f"{threads} thread(s)  {case:18s} base {b:7.1f} ms  this {t:7.1f} ms  this/base {t / b:.2f}")
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
