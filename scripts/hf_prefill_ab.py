"""HF transformers' prefill functions replaced by linattn, two source trees side by side: each process imports one
tree and times HF's own torch function and the tree's replacement interleaved (medians), so the ratio HF / linattn
of each process carries the load the process saw; the trees alternate process by process.

Cases, B = 1, float32, T = ``--T``:

* Gated DeltaNet at Qwen3.5's layer (16 q/k heads, 32 value heads, 128 x 128): q, k, v contiguous, and as the
  layer passes them (views split from one ``[B, T, 8192]`` projection);
* Mamba-2's chunk scan at Mamba-2-2.7B's layer (80 heads of 64, state 128, one group);
* the short convolution with SiLU at Mamba-2-2.7B's 5376 channels, kernel 4 (``[B, C, T]``, a transposed view).

    mkdir -p /tmp/linattn-main && git archive main src | tar -x -C /tmp/linattn-main
    PYTHONPATH=src python scripts/hf_prefill_ab.py /tmp/linattn-main/src src --out benchmarks/results/x_ab_cpu.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import inspect, json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import numba, torch
import torch.nn.functional as F
from linattn.backends import cpu
from linattn.integrations import transformers as lt
kernel_s = []
import linattn.kernels  # the prefill kernel's module: cpu_prefill, or cpu_numba in trees from before the split
split = os.path.exists(os.path.join(os.path.dirname(linattn.kernels.__file__), "cpu_prefill.py"))
token_loops = cpu.kernel("cpu_prefill") if split else cpu.load()
prefill = token_loops.prefill
def timed_prefill(*a, **kw):  # the compiled token loop's own time inside each call
    t0 = time.perf_counter()
    try:
        return prefill(*a, **kw)
    finally:
        kernel_s.append(time.perf_counter() - t0)
token_loops.prefill = timed_prefill
threads, T, repeats, wanted = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(";")
with_hf = sys.argv[6] == "1"
torch.set_num_threads(threads)
numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
def hf(model, name):
    return inspect.unwrap(lt.original(lt.modeling(model), name))
gen = torch.Generator().manual_seed(0)
cases = {}
H, HV, D = 16, 32, 128
q, k = (torch.randn(1, T, H, D, generator=gen) for _ in range(2))
v = torch.randn(1, T, HV, D, generator=gen)
g = -F.softplus(torch.randn(1, T, HV, generator=gen)) * 0.1
beta = torch.rand(1, T, HV, generator=gen)
kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
proj = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], -1)
qs, ks, vs = (t.reshape(1, T, -1, D) for t in proj.split([H * D, H * D, HV * D], -1))
gd = hf("qwen3_5", "torch_chunk_gated_delta_rule")
cases["gated_delta, contiguous"] = (lambda: gd(q, k, v, g, beta, **kw),
                                    lambda: lt.chunk_gated_delta_rule(q, k, v, g, beta, **kw))
cases["gated_delta, split views"] = (lambda: gd(qs, ks, vs, g, beta, **kw),
                                     lambda: lt.chunk_gated_delta_rule(qs, ks, vs, g, beta, **kw))
H, P, N = 80, 64, 128
x = torch.randn(1, T, H, P, generator=gen)
dt = torch.randn(1, T, H, generator=gen) - 2
A = -torch.rand(H, generator=gen) * 8 - 1
Bm, Cm = (torch.randn(1, T, 1, N, generator=gen) for _ in range(2))
Dp, dt_bias = torch.randn(H, generator=gen), torch.randn(H, generator=gen) * 0.1
skw = dict(D=Dp, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
scan = hf("mamba2", "mamba2_chunk_scan")
cases["mamba2 chunk scan"] = (lambda: scan(x, dt, A, Bm, Cm, 256, **skw),
                              lambda: lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, 256, **skw))
C = 5120 + 2 * N
xc = torch.randn(1, T, C, generator=gen).transpose(1, 2)
w, b = torch.randn(C, 4, generator=gen), torch.randn(C, generator=gen)
conv = hf("mamba2", "causal_conv1d_fn")
cases["conv, silu"] = (lambda: conv(xc, w, b, "silu"), lambda: lt.causal_conv1d_fn(xc, w, b, "silu"))
out = {}
with torch.no_grad():
    for name in wanted:
        fns = cases[name] if with_hf else (lambda: None, cases[name][1])
        for f in fns:
            f()
        samples = [[], []]
        kernel_ms = []
        for _ in range(repeats):
            for f, s in zip(fns, samples):
                kernel_s.clear()
                t0 = time.perf_counter(); f(); s.append((time.perf_counter() - t0) * 1e3)
            kernel_ms.append(sum(kernel_s) * 1e3)
        out[name] = [statistics.median(s) if with_hf or i else float("nan") for i, s in enumerate(samples)]
        # outside the token loop: the adapter's own work (median over runs of each run's difference)
        adapter = [s - k for s, k in zip(samples[1], kernel_ms)] if any(kernel_ms) else [float("nan")]
        out[name] += [statistics.median(adapter), os.getloadavg()[0]]
print(json.dumps(out))
'''

CASES = ("gated_delta, contiguous", "gated_delta, split views", "mamba2 chunk scan", "conv, silu")


def processor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown processor"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the baseline tree's src/ folder")
    parser.add_argument("this", help="this tree's src/ folder")
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2, help="processes per tree and thread count, alternating")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per function in a process")
    parser.add_argument("--cases", default=";".join(CASES), help=f"';'-separated, of: {'; '.join(CASES)}")
    parser.add_argument("--skip-hf", action="store_true", help="time only the trees' functions (HF's take seconds)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    trees = {"base": args.base, "this": args.this}
    env = dict(os.environ, NUMBA_NUM_THREADS=str(max(args.threads)))
    results: dict = {}
    for threads in args.threads:
        for r in range(args.rounds):
            for tree in (("base", "this") if r % 2 == 0 else ("this", "base")):
                cmd = [sys.executable, "-c", CHILD, trees[tree], str(threads), str(args.T), str(args.repeats),
                       args.cases, "0" if args.skip_hf else "1"]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"{tree} tree, {threads} threads:\n{proc.stderr}")
                got = json.loads(proc.stdout)
                for case, row in got.items():
                    results.setdefault((threads, case), {"base": [], "this": []})[tree].append(row)
                    print(threads, tree, case, [round(x, 2) for x in row], flush=True)
    lines = [f"HF's torch functions vs linattn's replacements, two trees ({args.base} = base, {args.this} = this), "
             f"{processor()}, {os.cpu_count()} cores shared with other jobs, float32, B = 1, T = {args.T}.",
             f"Per process: medians of {args.repeats} interleaved runs each; {args.rounds} processes per tree and "
             "thread count, the trees alternating; the row gives the median over processes and the 1-min load "
             "average range the processes saw.", "",
             "'adapter': the call's time outside the compiled token loop (none for the convolution, whose kernel "
             "is split over threads in this tree), median over runs.", "",
             f"{'threads':>7}  {'case':28s} {'HF ms':>9} {'base ms':>9} {'this ms':>9} {'HF/base':>8} {'HF/this':>8}"
             f" {'this/base':>9} {'adapter base':>12} {'adapter this':>12}  load"]
    for (threads, case), by_tree in results.items():
        med = {t: [statistics.median(col) for col in zip(*rows, strict=True)] for t, rows in by_tree.items()}
        ratio = {t: statistics.median(r[0] / r[1] for r in rows) for t, rows in by_tree.items()}
        hf_ms = statistics.median([r[0] for rows in by_tree.values() for r in rows])
        loads = [r[3] for rows in by_tree.values() for r in rows]
        lines.append(f"{threads:>7}  {case:28s} {hf_ms:9.1f} {med['base'][1]:9.1f} {med['this'][1]:9.1f} "
                     f"{ratio['base']:7.2f}x {ratio['this']:7.2f}x {med['this'][1] / med['base'][1]:9.2f} "
                     f"{med['base'][2]:12.1f} {med['this'][2]:12.1f}  {min(loads):.1f}-{max(loads):.1f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from linattn.tools.harness.results import atomic_write

        atomic_write(args.out, lambda p: p.write_text(text, encoding="utf-8"), overwrite=args.overwrite)


if __name__ == "__main__":
    main()
